"""Query and Delete in every state, idempotency, batches."""

from __future__ import annotations

import grpc
import pytest

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, ack, enqueue, in_seconds, ms, query, stats
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until


def _in_state(stub: Stub, queue: str, state: int) -> tuple[str, Consumer | None]:
    """Puts a fresh job in ``state``; returns its id and the consumer holding it, if any."""
    if state == job_pb2.JOB_STATE_SCHEDULED:
        return enqueue(stub, queue, delay=ms(3_600_000)), None
    if state == job_pb2.JOB_STATE_READY:
        return enqueue(stub, queue), None
    c = Consumer(stub, [queue])
    job_id = enqueue(stub, queue)
    (d,) = c.take()
    if state == job_pb2.JOB_STATE_DEAD:
        stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True))
    elif state == job_pb2.JOB_STATE_COMPLETED:
        ack(stub, d.lease_token)
    return job_id, c


STATES = [
    job_pb2.JOB_STATE_SCHEDULED,
    job_pb2.JOB_STATE_READY,
    job_pb2.JOB_STATE_LEASED,
    job_pb2.JOB_STATE_DEAD,
    job_pb2.JOB_STATE_COMPLETED,
]


@pytest.mark.parametrize("state", STATES, ids=job_pb2.JobState.Name)
def test_query_in_each_state(stub: Stub, queue: str, state: int) -> None:
    job_id, c = _in_state(stub, queue, state)
    try:
        job = query(stub, queue, job_id)
        assert (job.id, job.queue, job.namespace, job.state) == (job_id, queue, "default", state)
        assert job.payload == b"job" and job.HasField("create_time") and job.HasField("due_time")
        assert job.HasField("last_delivery_time") == (state >= job_pb2.JOB_STATE_LEASED)
        assert job.HasField("finish_time") == (state >= job_pb2.JOB_STATE_DEAD)
    finally:
        if c:
            c.close()


@pytest.mark.parametrize("state", STATES, ids=job_pb2.JobState.Name)
def test_delete_in_each_state_and_never_delivered(stub: Stub, queue: str, state: int) -> None:
    job_id, c = _in_state(stub, queue, state)
    try:
        resp = stub.Delete(service_pb2.DeleteRequest(queue=queue, job_id=job_id))
        assert resp.previous_state == state
        with pytest.raises(grpc.RpcError) as err:
            query(stub, queue, job_id)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as err:
            stub.Delete(service_pb2.DeleteRequest(queue=queue, job_id=job_id))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        if c:
            c.close()
    marker = enqueue(stub, queue, payload=b"marker")
    with Consumer(stub, [queue]) as c2:
        (d,) = c2.take()
    assert d.job.id == marker  # the deleted job never came out, even after its stream closed
    s = stats(stub, queue)
    assert (s.scheduled, s.dead) == (0, 0)


def test_idempotency_key_within_and_after_the_window(redis_server: ManagedRedis) -> None:
    with (
        DelayqProcess(redis_server.url, ["--idempotency-window", "1s"]) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        req = service_pb2.EnqueueRequest(queue="idem", payload=b"a", idempotency_key="order-42")
        first = stub.Enqueue(req)
        again = stub.Enqueue(req)
        assert not first.duplicate and again.duplicate and again.job_id == first.job_id
        assert stats(stub, "idem").enqueued_total == 1

        def new_id() -> bool:
            return not stub.Enqueue(req).duplicate

        wait_until(new_id, timeout=5, interval=0.2)


def test_batch_stores_valid_jobs_and_refuses_the_rest(stub: Stub, queue: str) -> None:
    reqs = [
        service_pb2.EnqueueRequest(queue=queue, payload=b"ok-1"),
        service_pb2.EnqueueRequest(queue=queue, payload=b""),
        service_pb2.EnqueueRequest(queue="bad{name}", payload=b"x"),
        service_pb2.EnqueueRequest(queue=queue, payload=b"ok-2", delay=ms(100)),
        service_pb2.EnqueueRequest(queue=queue, payload=b"x", max_attempts=5000),
        service_pb2.EnqueueRequest(
            queue=queue, payload=b"x", due_time=in_seconds(3600), ttl=ms(1000)
        ),
    ]
    resp = stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs))
    assert [r.HasField("response") for r in resp.results] == [
        True,
        False,
        False,
        True,
        False,
        False,
    ]
    errs = {i: r.error for i, r in enumerate(resp.results) if r.HasField("error")}
    assert all(e.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] for e in errs.values())
    assert errs[1].message.startswith("requests[1].payload")
    assert errs[2].message.startswith("requests[2].queue")
    assert errs[4].message.startswith("requests[4].max_attempts")
    assert errs[5].message.startswith("requests[5].ttl")
    assert stats(stub, queue).enqueued_total == 2
    with Consumer(stub, [queue]) as c:
        got = {d.job.payload for d in c.take(2)}
    assert got == {b"ok-1", b"ok-2"}


def test_batch_of_many_jobs_across_queues(stub: Stub, queue: str) -> None:
    reqs = [
        service_pb2.EnqueueRequest(queue=f"{queue}-{i % 3}", payload=str(i).encode())
        for i in range(1000)
    ]
    resp = stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs))
    ids = [r.response.job_id for r in resp.results]
    assert len(set(ids)) == 1000
    assert sum(stats(stub, f"{queue}-{i}").ready for i in range(3)) == 1000


def test_deleting_a_leased_job_gives_its_stream_the_credit_back(stub: Stub, queue: str) -> None:
    first = enqueue(stub, queue)
    with Consumer(stub, [queue], max_outstanding=1) as c:
        (d,) = c.take()
        assert d.job.id == first
        stub.Delete(service_pb2.DeleteRequest(queue=queue, job_id=first))
        second = enqueue(stub, queue)
        (d2,) = c.take(timeout=8)  # no ack was sent: the delete freed the slot (stall check: 10 s)
        assert d2.job.id == second


def test_batch_spread_over_hundreds_of_queues(stub: Stub, queue: str) -> None:
    # One script call per shard runs concurrently: the Redis pool must queue them.
    reqs = [
        service_pb2.EnqueueRequest(queue=f"{queue[:40]}-{i}", payload=b"x", delay=ms(3_600_000))
        for i in range(300)
    ]
    resp = stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs), timeout=30)
    assert all(r.HasField("response") for r in resp.results)
