"""Every refusal: canonical code, a message naming the field, and Redis untouched."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import job_pb2, service_pb2
from tests.support.digest import redis_digest
from tests.support.rpc import Stub, in_seconds, ms
from tests.support.servers import DelayqProcess, ManagedRedis

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
E = service_pb2.EnqueueRequest
GOOD_ID = "06h03hkqjpgep0lubf6r2to"
GOOD_TOKEN = f"default/known/0/{GOOD_ID}/abc.1.0.1"


@pytest.fixture(scope="module")
def isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stub, redis.Redis]]:
    """A server on a Redis of its own, so nothing else writes while we compare."""
    with (
        ManagedRedis(Path(tmp_path_factory.mktemp("refusals")), appendonly=False) as r,
        DelayqProcess(r.url) as server,
        server.channel() as ch,
    ):
        client = redis.Redis.from_url(r.url)
        stub = server.stub(ch)
        stub.Enqueue(E(queue="known", payload=b"x", delay=ms(3_600_000)))
        yield stub, client
        client.close()


CASES: list[tuple[str, str, Any, grpc.StatusCode, str]] = [
    # (id, rpc, request, code, text the message starts with)
    ("queue empty", "Enqueue", E(queue="", payload=b"x"), INVALID, "queue"),
    ("queue with braces", "Enqueue", E(queue="a{b}", payload=b"x"), INVALID, "queue"),
    ("queue with colon", "Enqueue", E(queue="a:b", payload=b"x"), INVALID, "queue"),
    ("queue too long", "Enqueue", E(queue="q" * 65, payload=b"x"), INVALID, "queue"),
    ("namespace with slash", "Enqueue", E(namespace="a/b", queue="q", payload=b"x"), INVALID, "namespace"),
    ("payload empty", "Enqueue", E(queue="q"), INVALID, "payload"),
    ("payload too big", "Enqueue", E(queue="q", payload=b"x" * (256 * 1024 + 1)), INVALID, "payload"),
    ("delay negative", "Enqueue", E(queue="q", payload=b"x", delay=duration_pb2.Duration(seconds=-1)), INVALID, "delay"),
    ("delay absurd", "Enqueue", E(queue="q", payload=b"x", delay=duration_pb2.Duration(seconds=400 * 86400)), INVALID, "delay"),
    ("due_time far future", "Enqueue", E(queue="q", payload=b"x", due_time=timestamp_pb2.Timestamp(seconds=10**16)), INVALID, "due_time"),
    ("due_time int64 max", "Enqueue", E(queue="q", payload=b"x", due_time=timestamp_pb2.Timestamp(seconds=2**63 - 1)), INVALID, "due_time"),
    ("due_time over 366 days", "Enqueue", E(queue="q", payload=b"x", due_time=in_seconds(367 * 86400)), INVALID, "due_time"),
    ("ttl shorter than delay", "Enqueue", E(queue="q", payload=b"x", delay=ms(5000), ttl=ms(1000)), INVALID, "ttl"),
    ("ttl before due_time", "Enqueue", E(queue="q", payload=b"x", due_time=in_seconds(3600), ttl=ms(1000)), INVALID, "ttl"),
    ("max_attempts too high", "Enqueue", E(queue="q", payload=b"x", max_attempts=1001), INVALID, "max_attempts"),
    ("multiplier too high", "Enqueue", E(queue="q", payload=b"x", retry=job_pb2.RetryPolicy(multiplier=11)), INVALID, "retry.multiplier"),
    ("jitter above 1", "Enqueue", E(queue="q", payload=b"x", retry=job_pb2.RetryPolicy(jitter=2)), INVALID, "retry.jitter"),
    ("max below initial backoff", "Enqueue", E(queue="q", payload=b"x", retry=job_pb2.RetryPolicy(initial_backoff=ms(5000), max_backoff=ms(1000))), INVALID, "retry.max_backoff"),
    ("header value over 8192 UTF-8 bytes", "Enqueue", E(queue="q", payload=b"x", headers={"k": "é" * 4097}), INVALID, "headers['k']"),
    ("too many headers", "Enqueue", E(queue="q", payload=b"x", headers={str(i): "v" for i in range(65)}), INVALID, "headers"),
    ("idempotency key too long", "Enqueue", E(queue="q", payload=b"x", idempotency_key="k" * 257), INVALID, "idempotency_key"),
    ("batch empty", "EnqueueBatch", service_pb2.EnqueueBatchRequest(), INVALID, "requests"),
    ("batch over cap", "EnqueueBatch", service_pb2.EnqueueBatchRequest(requests=[E(queue="q", payload=b"x")] * 1001), INVALID, "requests"),
    ("consume no queues", "Consume", service_pb2.ConsumeRequest(max_outstanding=1), INVALID, "queues"),
    ("consume bad queue", "Consume", service_pb2.ConsumeRequest(queues=["ok", "b}d"], max_outstanding=1), INVALID, "queues[1]"),
    ("consume queue twice", "Consume", service_pb2.ConsumeRequest(queues=["a", "a"], max_outstanding=1), INVALID, "queues"),
    ("consume too many queues", "Consume", service_pb2.ConsumeRequest(queues=[f"q{i}" for i in range(17)], max_outstanding=1), INVALID, "queues"),
    ("max_outstanding zero", "Consume", service_pb2.ConsumeRequest(queues=["q"]), INVALID, "max_outstanding"),
    ("max_outstanding too high", "Consume", service_pb2.ConsumeRequest(queues=["q"], max_outstanding=10_001), INVALID, "max_outstanding"),
    ("lease too short", "Consume", service_pb2.ConsumeRequest(queues=["q"], max_outstanding=1, lease_duration=ms(500)), INVALID, "lease_duration"),
    ("lease too long", "Consume", service_pb2.ConsumeRequest(queues=["q"], max_outstanding=1, lease_duration=ms(13 * 3_600_000)), INVALID, "lease_duration"),
    ("max_batch too high", "Consume", service_pb2.ConsumeRequest(queues=["q"], max_outstanding=1, max_batch=1001), INVALID, "max_batch"),
    ("release grace negative", "Consume", service_pb2.ConsumeRequest(queues=["q"], max_outstanding=1, release_grace=duration_pb2.Duration(seconds=-1)), INVALID, "release_grace"),
    ("release grace over lease", "Consume", service_pb2.ConsumeRequest(queues=["q"], max_outstanding=1, lease_duration=ms(5000), release_grace=ms(5001)), INVALID, "release_grace"),
    ("release no tokens", "Release", service_pb2.ReleaseRequest(), INVALID, "lease_tokens"),
    ("release too many tokens", "Release", service_pb2.ReleaseRequest(lease_tokens=[GOOD_TOKEN] * 1001), INVALID, "lease_tokens"),
    ("release malformed token", "Release", service_pb2.ReleaseRequest(lease_tokens=[GOOD_TOKEN, "nonsense"]), INVALID, "lease_tokens[1]"),
    ("ack no tokens", "Ack", service_pb2.AckRequest(), INVALID, "lease_tokens"),
    ("ack too many tokens", "Ack", service_pb2.AckRequest(lease_tokens=[GOOD_TOKEN] * 1001), INVALID, "lease_tokens"),
    ("ack malformed token", "Ack", service_pb2.AckRequest(lease_tokens=[GOOD_TOKEN, "nonsense"]), INVALID, "lease_tokens[1]"),
    ("nack malformed token", "Nack", service_pb2.NackRequest(lease_token="x"), INVALID, "lease_token"),
    ("nack unknown job", "Nack", service_pb2.NackRequest(lease_token=GOOD_TOKEN), NOT_FOUND, "lease_token"),
    ("nack negative delay", "Nack", service_pb2.NackRequest(lease_token=GOOD_TOKEN, delay=duration_pb2.Duration(seconds=-5)), INVALID, "delay"),
    ("nack delay and dead letter", "Nack", service_pb2.NackRequest(lease_token=GOOD_TOKEN, delay=ms(5), dead_letter=True), INVALID, "delay"),
    ("nack reason too long", "Nack", service_pb2.NackRequest(lease_token=GOOD_TOKEN, reason="r" * 4097), INVALID, "reason"),
    ("extend malformed token", "ExtendLease", service_pb2.ExtendLeaseRequest(lease_token="x", extension=ms(5000)), INVALID, "lease_token"),
    ("extend missing extension", "ExtendLease", service_pb2.ExtendLeaseRequest(lease_token=GOOD_TOKEN), INVALID, "extension"),
    ("extend too short", "ExtendLease", service_pb2.ExtendLeaseRequest(lease_token=GOOD_TOKEN, extension=ms(10)), INVALID, "extension"),
    ("extend unknown job", "ExtendLease", service_pb2.ExtendLeaseRequest(lease_token=GOOD_TOKEN, extension=ms(5000)), NOT_FOUND, "lease_token"),
    ("query malformed id", "Query", service_pb2.QueryRequest(queue="known", job_id="../etc"), INVALID, "job_id"),
    ("query bad queue", "Query", service_pb2.QueryRequest(queue="a:b", job_id=GOOD_ID), INVALID, "queue"),
    ("query unknown queue", "Query", service_pb2.QueryRequest(queue="nope", job_id=GOOD_ID), NOT_FOUND, "job"),
    ("query unknown id", "Query", service_pb2.QueryRequest(queue="known", job_id=GOOD_ID), NOT_FOUND, "job"),
    ("query shard out of range", "Query", service_pb2.QueryRequest(queue="known", job_id=GOOD_ID + "-7"), NOT_FOUND, "job"),
    ("delete malformed id", "Delete", service_pb2.DeleteRequest(queue="known", job_id=""), INVALID, "job_id"),
    ("delete unknown id", "Delete", service_pb2.DeleteRequest(queue="known", job_id=GOOD_ID), NOT_FOUND, "job"),
    ("stats bad queue", "GetQueueStats", service_pb2.GetQueueStatsRequest(queue=""), INVALID, "queue"),
    ("dead page too big", "ListDeadJobs", service_pb2.ListDeadJobsRequest(queue="known", page_size=1001), INVALID, "page_size"),
    ("dead bad page token", "ListDeadJobs", service_pb2.ListDeadJobsRequest(queue="known", page_token="zz"), INVALID, "page_token"),
    ("dead page token negative offset", "ListDeadJobs", service_pb2.ListDeadJobsRequest(queue="known", page_token="0:-5"), INVALID, "page_token"),
    ("dead page token negative shard", "ListDeadJobs", service_pb2.ListDeadJobsRequest(queue="known", page_token="-1:0"), INVALID, "page_token"),
    ("dead page token shard out of range", "ListDeadJobs", service_pb2.ListDeadJobsRequest(queue="known", page_token="9:0"), INVALID, "page_token"),
    ("dead page token padded", "ListDeadJobs", service_pb2.ListDeadJobsRequest(queue="known", page_token=" 0:1"), INVALID, "page_token"),
    ("redrive bad id", "RedriveDeadJobs", service_pb2.RedriveDeadJobsRequest(queue="known", job_ids=["no"]), INVALID, "job_ids[0]"),
    ("purge limit too high", "PurgeDeadJobs", service_pb2.PurgeDeadJobsRequest(queue="known", limit=100_001), INVALID, "limit"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("rpc", "request_", "code", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_refusal(
    isolated: tuple[Stub, redis.Redis], rpc: str, request_: Any, code: grpc.StatusCode, field: str
) -> None:
    stub, client = isolated
    before = redis_digest(client)
    call: Callable[..., Any] = getattr(stub, rpc)
    with pytest.raises(grpc.RpcError) as err:
        result = call(request_, timeout=10)
        if rpc == "Consume":
            next(iter(result))
    assert err.value.code() == code, err.value.details()
    assert (err.value.details() or "").startswith(field), err.value.details()
    assert redis_digest(client) == before
