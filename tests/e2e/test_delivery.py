"""Delivery over real gRPC: due times, priority, flow control, ack, nack, leases."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf import timestamp_pb2

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, ack, enqueue, ms, query, stats
from tests.support.servers import wait_until


def _ts_ms(t: timestamp_pb2.Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


def test_delivery_is_never_before_due(stub: Stub, queue: str) -> None:
    sent = {}
    for delay in range(50, 650, 50):
        start = time.time()
        job_id = enqueue(stub, queue, delay=ms(delay))
        sent[job_id] = (start, delay)
    with Consumer(stub, [queue]) as c:
        got = c.take_timed(len(sent))
    for arrived, d in got:
        start, delay = sent[d.job.id]
        assert _ts_ms(d.job.last_delivery_time) >= _ts_ms(d.job.due_time)  # server clock
        assert arrived >= start + delay / 1000  # and the client's own clock
    assert [d.job.id for _, d in got] == list(sent)  # in due order


def test_due_time_schedules_at_an_instant(stub: Stub, queue: str) -> None:
    due = timestamp_pb2.Timestamp()
    due.FromMilliseconds(int(time.time() * 1000) + 300)
    job_id = enqueue(stub, queue, due_time=due)
    assert query(stub, queue, job_id).state == job_pb2.JOB_STATE_SCHEDULED
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
    assert d.job.id == job_id and _ts_ms(d.job.last_delivery_time) >= _ts_ms(due)


def test_queues_are_served_in_priority_order(stub: Stub, queue: str) -> None:
    low = [enqueue(stub, queue + "-low") for _ in range(3)]
    high = [enqueue(stub, queue + "-high") for _ in range(3)]
    with Consumer(stub, [queue + "-high", queue + "-low"], max_outstanding=1) as c:
        order = []
        for _ in range(6):
            (d,) = c.take()
            order.append(d.job.id)
            assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]
    assert order == high + low


def test_max_outstanding_is_honoured(stub: Stub, queue: str) -> None:
    for _ in range(10):
        enqueue(stub, queue)
    with Consumer(stub, [queue], max_outstanding=3) as c:
        first = c.take(3)
        wait_until(lambda: stats(stub, queue).leased == 3)
        assert stats(stub, queue).ready == 7
        assert c.received.empty()
        ack(stub, first[0].lease_token)
        c.take(1)
        wait_until(lambda: stats(stub, queue).ready == 6)
        assert stats(stub, queue).leased == 3


def test_ack_completes_the_job(stub: Stub, queue: str) -> None:
    job_id = enqueue(stub, queue)
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
        assert (d.attempt, d.job.attempts) == (1, 1)
        assert ack(stub, d.lease_token, d.lease_token) == [
            service_pb2.ACK_RESULT_ACKED,
            service_pb2.ACK_RESULT_ACKED,  # idempotent while the completed job is retained
        ]
    assert query(stub, queue, job_id).state == job_pb2.JOB_STATE_COMPLETED
    assert stats(stub, queue).acked_total == 1


def test_nack_without_delay_uses_the_retry_policy(stub: Stub, queue: str) -> None:
    retry = job_pb2.RetryPolicy(initial_backoff=ms(300), multiplier=2)
    job_id = enqueue(stub, queue, retry=retry)
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
        resp = stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, reason="flaky"))
        assert resp.state == job_pb2.JOB_STATE_SCHEDULED
        assert _ts_ms(resp.due_time) - _ts_ms(d.job.last_delivery_time) >= 300
        job = query(stub, queue, job_id)
        assert (job.state, job.last_error) == (job_pb2.JOB_STATE_SCHEDULED, "flaky")
        (again,) = c.take()
        assert again.attempt == 2 and _ts_ms(again.job.last_delivery_time) >= _ts_ms(resp.due_time)


def test_nack_with_delay_overrides_the_policy(stub: Stub, queue: str) -> None:
    enqueue(stub, queue, retry=job_pb2.RetryPolicy(initial_backoff=ms(3_600_000)))
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
        resp = stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, delay=ms(200)))
        assert _ts_ms(resp.due_time) - _ts_ms(d.job.last_delivery_time) < 1_000
        (again,) = c.take()
        assert again.attempt == 2


def test_lease_expiry_redelivers_with_next_attempt_and_fences_the_old_token(
    stub: Stub, queue: str
) -> None:
    enqueue(stub, queue, retry=job_pb2.RetryPolicy(initial_backoff=ms(0)))
    with Consumer(stub, [queue], lease_ms=1_000) as c:
        (first,) = c.take()
        (second,) = c.take(timeout=5)  # lease ran out; redelivered by the reaper
    assert second.job.id == first.job.id
    assert second.attempt == first.attempt + 1
    assert second.lease_token != first.lease_token
    assert ack(stub, first.lease_token) == [service_pb2.ACK_RESULT_STALE]
    for call, req in [
        (stub.Nack, service_pb2.NackRequest(lease_token=first.lease_token)),
        (
            stub.ExtendLease,
            service_pb2.ExtendLeaseRequest(lease_token=first.lease_token, extension=ms(5_000)),
        ),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            call(req)  # type: ignore[operator]
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "stale" in (err.value.details() or "")


def test_extend_lease_keeps_the_job(stub: Stub, queue: str) -> None:
    enqueue(stub, queue)
    with Consumer(stub, [queue], lease_ms=3_000) as c:  # extended before it runs out
        (d,) = c.take()
        resp = stub.ExtendLease(
            service_pb2.ExtendLeaseRequest(lease_token=d.lease_token, extension=ms(30_000))
        )
        assert _ts_ms(resp.lease_deadline) > _ts_ms(d.lease_deadline)
        wait_until(lambda: time.time() * 1000 > _ts_ms(d.lease_deadline) + 1_200, timeout=15)
        assert c.received.empty()
        assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]


def test_dead_lettered_after_max_attempts(stub: Stub, queue: str) -> None:
    job_id = enqueue(stub, queue, max_attempts=3, retry=job_pb2.RetryPolicy(initial_backoff=ms(0)))
    with Consumer(stub, [queue]) as c:  # one stream throughout: no closing stream to race
        for attempt in (1, 2, 3):
            (d,) = c.take()
            assert d.attempt == attempt
            stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, reason=f"fail {attempt}"))
        wait_until(lambda: query(stub, queue, job_id).state == job_pb2.JOB_STATE_DEAD)
        job = query(stub, queue, job_id)
        assert (job.attempts, job.last_error) == (3, "fail 3")
        s = stats(stub, queue)
        assert (s.dead, s.dead_lettered_total, s.retried_total) == (1, 1, 2)
        dead = stub.ListDeadJobs(service_pb2.ListDeadJobsRequest(queue=queue))
        assert [j.id for j in dead.jobs] == [job_id]
        assert stub.RedriveDeadJobs(service_pb2.RedriveDeadJobsRequest(queue=queue)).redriven == 1
        (d,) = c.take()
        assert d.job.id == job_id and d.attempt == 1  # attempts start over


def test_nack_dead_letter_flag(stub: Stub, queue: str) -> None:
    job_id = enqueue(stub, queue)
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
        resp = stub.Nack(
            service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True, reason="poison")
        )
    assert resp.state == job_pb2.JOB_STATE_DEAD
    assert query(stub, queue, job_id).last_error == "poison"
    purge = stub.PurgeDeadJobs(service_pb2.PurgeDeadJobsRequest(queue=queue, job_ids=[job_id]))
    assert purge.purged == 1


def test_ttl_expired_job_is_dropped_and_never_delivered(stub: Stub, queue: str) -> None:
    job_id = enqueue(stub, queue, ttl=ms(300))

    def gone() -> bool:
        try:
            query(stub, queue, job_id)
        except grpc.RpcError as exc:
            return exc.code() == grpc.StatusCode.NOT_FOUND
        return False

    wait_until(gone, timeout=5)
    assert stats(stub, queue).expired_total == 1
    fresh = enqueue(stub, queue)
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
    assert d.job.id == fresh
