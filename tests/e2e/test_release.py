"""Giving deliveries back: Release (uncounted), stream ends (counted), the release grace."""

from __future__ import annotations

import time

import grpc

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, ack, enqueue, ms, query, release, stats
from tests.support.servers import wait_until

RELEASED = service_pb2.RELEASE_RESULT_RELEASED
STALE = service_pb2.RELEASE_RESULT_STALE
UNKNOWN = service_pb2.RELEASE_RESULT_UNKNOWN
MIB = 1024 * 1024


def test_release_answers_per_token_returns_credit_and_counts_no_attempt(
    stub: Stub, queue: str
) -> None:
    ids = [enqueue(stub, queue, max_attempts=1) for _ in range(3)]
    with Consumer(stub, [queue], max_outstanding=2) as c:
        a, b = c.take(2)
        assert {a.attempt, b.attempt} == {1}
        unknown = f"default/{queue}/0/06h03hkqjpgep0lubf6r2to/abc.1.0.1"
        stale = a.lease_token.rsplit(".", 1)[0] + ".999"
        assert release(stub, a.lease_token, stale, unknown, b.lease_token) == [
            RELEASED,
            STALE,
            UNKNOWN,
            RELEASED,
        ]
        assert release(stub, a.lease_token) == [STALE]  # a repeat changes nothing
        # Credit came back: the stream is served again, first the given-back jobs
        # (ready at the consuming end), still on their first attempt although
        # max_attempts is 1: a give-back never dead-letters.
        again = c.take(2)
        assert {d.job.id for d in again} == {a.job.id, b.job.id}
        assert {d.attempt for d in again} == {1}
        assert ack(stub, *(d.lease_token for d in again)) == [service_pb2.ACK_RESULT_ACKED] * 2
        (last,) = c.take()
        assert last.job.id == ids[2]
        assert ack(stub, last.lease_token) == [service_pb2.ACK_RESULT_ACKED]
    s = stats(stub, queue)
    assert (s.dead, s.acked_total) == (0, 3)


def test_a_stream_end_counts_the_attempt_so_a_crashing_job_is_dead_lettered(
    stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue, max_attempts=2)
    for attempt in (1, 2):
        with Consumer(stub, [queue], lease_ms=600_000) as c:
            (d,) = c.take()
            assert d.attempt == attempt
        # Closed without a word, as a crashing worker's stream ends.
    wait_until(lambda: query(stub, queue, job_id).state == job_pb2.JOB_STATE_DEAD, timeout=10)
    job = query(stub, queue, job_id)
    assert (job.attempts, job.last_error) == (2, "consumer went away on the final attempt")


def test_with_a_grace_a_handler_outliving_its_stream_still_acks_and_runs_once(
    stub: Stub, queue: str
) -> None:
    grace_ms = 2_000
    kept = enqueue(stub, queue)
    with Consumer(stub, [queue], release_grace_ms=grace_ms) as first:
        (d,) = first.take()
    dropped = time.time()
    # The worker reconnects at once; the handler is still running.
    with Consumer(stub, [queue], release_grace_ms=grace_ms) as second:
        # It extends its lease within the grace (keeping it) and acks after the grace.
        stub.ExtendLease(
            service_pb2.ExtendLeaseRequest(lease_token=d.lease_token, extension=ms(30_000))
        )
        wait_until(lambda: time.time() > dropped + grace_ms / 1000 + 0.5, timeout=10)
        assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]
        # Not delivered twice: the next thing the new stream gets is a new job.
        sentinel = enqueue(stub, queue)
        (n,) = second.take()
        assert n.job.id == sentinel
        assert second.received.empty()
    assert query(stub, queue, kept).state == job_pb2.JOB_STATE_COMPLETED


def test_with_a_grace_an_ack_over_a_unary_call_settles_a_dropped_stream_s_lease(
    stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue)
    with Consumer(stub, [queue], release_grace_ms=3_000) as c:
        (d,) = c.take()
    assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]
    assert query(stub, queue, job_id).state == job_pb2.JOB_STATE_COMPLETED


def test_with_a_grace_an_unsettled_lease_is_released_after_it_and_counted(
    stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue)
    with Consumer(stub, [queue], release_grace_ms=1_500, lease_ms=600_000) as c:
        c.take()
        closed = time.time()  # before the close: the grace starts when the server sees it
    with Consumer(stub, [queue]) as again:
        (d,) = again.take(timeout=20)
    arrived = time.time()
    assert d.job.id == job_id and d.attempt == 2  # a crash counts the attempt
    assert arrived >= closed + 1.5  # not before the grace


def test_without_a_grace_a_dropped_stream_s_job_is_redelivered_at_once(
    stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue)
    with Consumer(stub, [queue], lease_ms=600_000) as c:
        (d,) = c.take()
    with Consumer(stub, [queue], lease_ms=600_000) as again:
        (redelivered,) = again.take(timeout=8)  # below the 10 s stall check, the 10-min lease
    assert redelivered.job.id == job_id and redelivered.attempt == 2
    assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_STALE]


def test_big_jobs_reach_a_default_client_split_under_the_byte_cap(
    channel: grpc.Channel, stub: Stub, queue: str
) -> None:
    # `channel` is a default grpc channel: 4 MiB receive limit. 40 jobs of
    # 262,128 bytes (10 MiB together) claimed at once must not fail the reads.
    ids = {enqueue(stub, queue, payload=b"x" * 262_128) for _ in range(40)}
    call = stub.Consume(service_pb2.ConsumeRequest(queues=[queue], max_outstanding=40))
    got: list[job_pb2.Delivery] = []
    sizes = []
    try:
        for resp in call:
            sizes.append(resp.ByteSize())
            got += resp.deliveries
            if len(got) == 40:
                break
        assert ack(stub, *(d.lease_token for d in got)) == [service_pb2.ACK_RESULT_ACKED] * 40
    finally:
        call.cancel()  # type: ignore[no-untyped-call]
    assert {d.job.id for d in got} == ids
    assert {d.attempt for d in got} == {1}  # no failed read used an attempt
    assert max(sizes) <= MIB  # the default cap
    assert len(sizes) >= 10  # several messages for one claimed batch
