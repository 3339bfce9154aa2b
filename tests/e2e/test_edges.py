"""Issue 8's edge defects: far-future due times, batches that fail per item,
undecodable requests, page tokens, idempotency after the job is gone, Nack states."""

from __future__ import annotations

import time

import grpc
import pytest
import redis
from google.protobuf import timestamp_pb2

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, enqueue, ms, query
from tests.support.servers import ManagedRedis

INVALID = grpc.StatusCode.INVALID_ARGUMENT
E = service_pb2.EnqueueRequest
DAY_S = 86_400


def _ts(seconds: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def _ts_ms(t: timestamp_pb2.Timestamp) -> int:
    return t.seconds * 1000 + t.nanos // 1_000_000


@pytest.mark.parametrize(
    "seconds",
    [10**16, 2**63 - 1, 253402300800, int(time.time()) + 367 * DAY_S],
    ids=["1e16", "int64 max", "after year 9999", "367 days ahead"],
)
def test_far_future_due_time_is_refused_not_delivered_now(
    stub: Stub, queue: str, seconds: int
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        stub.Enqueue(E(queue=queue, payload=b"x", due_time=_ts(seconds)), timeout=10)
    assert err.value.code() == INVALID
    assert (err.value.details() or "").startswith("due_time"), err.value.details()
    assert "366 days" in (err.value.details() or "")


def test_due_time_at_the_bound_is_kept_in_the_backlog(stub: Stub, queue: str) -> None:
    """365 days ahead is inside the bound and scheduled (not 'now', no float keys)."""
    due = _ts(int(time.time()) + 365 * DAY_S)
    resp = stub.Enqueue(E(queue=queue, payload=b"x", due_time=due), timeout=10)
    assert _ts_ms(resp.due_time) == _ts_ms(due)
    assert query(stub, queue, resp.job_id).state == job_pb2.JOB_STATE_SCHEDULED


def test_one_bad_item_does_not_fail_the_batch(stub: Stub, queue: str) -> None:
    resp = stub.EnqueueBatch(
        service_pb2.EnqueueBatchRequest(
            requests=[
                E(queue=queue, payload=b"good", delay=ms(60_000)),
                E(queue=queue, payload=b"bad", due_time=_ts(2**63 - 1)),
                E(queue=queue, payload=b"good too"),
            ]
        ),
        timeout=10,
    )
    good, bad, good_too = resp.results
    assert good.response.job_id and good_too.response.job_id
    assert bad.error.code == INVALID.value[0]
    assert bad.error.message.startswith("requests[1].due_time"), bad.error.message
    assert query(stub, queue, good.response.job_id).state == job_pb2.JOB_STATE_SCHEDULED
    assert query(stub, queue, good_too.response.job_id).state == job_pb2.JOB_STATE_READY


def test_a_failing_shard_fails_only_its_own_items(
    stub: Stub, queue: str, redis_server: ManagedRedis
) -> None:
    """A Redis error on one queue's shard answers its items; the others are stored."""
    broken = queue + "-broken"
    enqueue(stub, broken)  # creates the queue
    client = redis.Redis.from_url(redis_server.url)
    try:
        # The ready list of the broken shard becomes a string: every script on it fails.
        client.delete(f"dq:{{default/{broken}/0}}:ready")
        client.set(f"dq:{{default/{broken}/0}}:ready", "not a list")
        resp = stub.EnqueueBatch(
            service_pb2.EnqueueBatchRequest(
                requests=[
                    E(queue=queue, payload=b"a"),
                    E(queue=broken, payload=b"b"),
                    E(queue=queue, payload=b"c"),
                ]
            ),
            timeout=10,
        )
    finally:
        client.delete(f"dq:{{default/{broken}/0}}:ready")
        client.close()
    a, b, c = resp.results
    assert b.error.code == grpc.StatusCode.INTERNAL.value[0] and not b.response.job_id
    assert "redis" not in b.error.message.lower() or "WRONGTYPE" not in b.error.message
    for item in (a, c):
        assert item.error.code == 0
        assert query(stub, queue, item.response.job_id).state == job_pb2.JOB_STATE_READY


def test_undecodable_request_bytes_get_invalid_argument(channel: grpc.Channel) -> None:
    call = channel.unary_unary(
        "/delayq.v1.DelayQueueService/Enqueue",
        request_serializer=None,
        response_deserializer=None,
    )
    with pytest.raises(grpc.RpcError) as err:
        call(b"\xff\xff\xff\xff garbage", timeout=10)
    assert err.value.code() == INVALID, err.value.details()
    details = err.value.details() or ""
    assert "class" not in details and "DecodeError" not in details, details


def test_undecodable_stream_request_gets_invalid_argument(channel: grpc.Channel) -> None:
    call = channel.unary_stream(
        "/delayq.v1.DelayQueueService/Consume",
        request_serializer=None,
        response_deserializer=None,
    )
    with pytest.raises(grpc.RpcError) as err:
        next(iter(call(b"\x0a\xff", timeout=10)))
    assert err.value.code() == INVALID, err.value.details()


def test_duplicate_idempotency_key_after_the_job_is_gone_keeps_its_due_time(
    stub: Stub, queue: str
) -> None:
    req = E(queue=queue, payload=b"x", delay=ms(3_600_000), idempotency_key="order-7")
    first = stub.Enqueue(req, timeout=10)
    stub.Delete(service_pb2.DeleteRequest(queue=queue, job_id=first.job_id), timeout=10)
    again = stub.Enqueue(req, timeout=10)
    assert again.duplicate and again.job_id == first.job_id
    assert _ts_ms(again.due_time) == _ts_ms(first.due_time)


def test_nack_answers_scheduled_or_dead_only(stub: Stub, queue: str) -> None:
    enqueue(stub, queue, max_attempts=2)
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
        resp = stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, delay=ms(0)))
        assert resp.state == job_pb2.JOB_STATE_SCHEDULED
        assert _ts_ms(resp.due_time) >= _ts_ms(d.job.last_delivery_time)
        (again,) = c.take()
        resp = stub.Nack(service_pb2.NackRequest(lease_token=again.lease_token, delay=ms(0)))
        assert resp.state == job_pb2.JOB_STATE_DEAD and not resp.HasField("due_time")
