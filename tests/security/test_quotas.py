"""One test per quota and limit: each refusal is RESOURCE_EXHAUSTED naming the quota,
with when to retry (message and `retry-after-ms` trailer)."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import redis

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.rpc import Stub
from tests.support.servers import DelayqProcess, wait_until

_ns = itertools.count()
LIMITS = [
    "--quota-enqueue-rate", "5", "--quota-enqueue-burst", "5",
    "--quota-jobs", "8", "--quota-queues", "2", "--quota-streams", "1",
    "--max-concurrent-rpcs", "3", "--max-message-bytes", str(1024 * 1024),
]  # fmt: skip


@pytest.fixture
def limited(redis_url: str) -> Iterator[Stub]:
    with DelayqProcess(redis_url, LIMITS) as proc, grpc.insecure_channel(proc.address) as ch:
        yield service_pb2_grpc.DelayQueueServiceStub(ch)


@pytest.fixture
def ns() -> str:
    return f"quota{next(_ns)}"


def _enqueue(stub: Stub, ns: str, queue: str = "q") -> grpc.RpcError | None:
    try:
        stub.Enqueue(
            service_pb2.EnqueueRequest(namespace=ns, queue=queue, payload=b"x"), timeout=10
        )
        return None
    except grpc.RpcError as exc:
        return exc


def _retry_after(err: grpc.RpcError) -> int:
    trailers: dict[str, Any] = {m.key: m.value for m in err.trailing_metadata() or ()}
    return int(trailers["retry-after-ms"])


def test_enqueue_rate(limited: Stub, ns: str) -> None:
    # Calls until the first refusal: on a loaded machine slow calls see the refill.
    start = time.monotonic()
    errors: list[grpc.RpcError | None] = []
    while len(errors) < 30 and (not errors or errors[-1] is None):
        errors.append(_enqueue(limited, ns))
    elapsed = time.monotonic() - start
    admitted = sum(1 for e in errors if e is None)
    assert 5 <= admitted <= 5 + 5 * elapsed + 1  # burst 5, refilling at 5/s
    err = errors[-1]
    assert err is not None
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "enqueue rate" in (err.details() or "") and "retry in" in (err.details() or "")
    assert 0 < _retry_after(err) <= 1000
    # Another namespace has its own bucket.
    assert _enqueue(limited, ns + "-other") is None
    # A batch beyond the burst is refused per item, naming the quota.
    batch = service_pb2.EnqueueBatchRequest(
        requests=[service_pb2.EnqueueRequest(namespace=ns + "-b", queue="q", payload=b"x")] * 6
    )
    results = limited.EnqueueBatch(batch, timeout=10).results
    assert all(r.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] for r in results)
    assert "burst" in results[0].error.message


def test_stored_jobs(limited: Stub, ns: str) -> None:
    """8 jobs at most; the rate quota (5/s) means waiting for tokens on the way."""
    stored = 0

    def fill() -> bool:
        nonlocal stored
        err = _enqueue(limited, ns)
        if err is None:
            stored += 1
            return False
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = err.details() or ""
        return "stores" in details

    wait_until(fill, timeout=30, interval=0.05)
    assert stored >= 8  # the count is re-read each second, so it may overshoot a little
    err = _enqueue(limited, ns)
    assert err is not None and "stores" in (err.details() or "")


def test_queues_per_namespace(limited: Stub, ns: str, redis_url: str) -> None:
    assert _enqueue(limited, ns, "q1") is None
    assert _enqueue(limited, ns, "q2") is None
    err = _enqueue(limited, ns, "q3")
    assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queues" in (err.details() or "")
    assert _enqueue(limited, ns, "q1") is None  # existing queues keep working
    r = redis.Redis.from_url(redis_url)
    assert not r.exists(f"dq:{{{ns}/q3}}:meta")
    r.close()


def test_consume_streams_per_namespace(limited: Stub, ns: str) -> None:
    req = service_pb2.ConsumeRequest(namespace=ns, queues=["q"], max_outstanding=1)
    first = limited.Consume(req)
    assert _enqueue(limited, ns) is None
    assert next(iter(first)).deliveries  # the first stream is open and serving
    second = limited.Consume(req, timeout=10)
    with pytest.raises(grpc.RpcError) as info:
        next(iter(second))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "Consume streams" in (info.value.details() or "")
    first.cancel()  # type: ignore[no-untyped-call]

    def reopened() -> bool:
        call = limited.Consume(req, timeout=2)
        try:
            next(iter(call))
        except grpc.RpcError as exc:
            # No job to deliver within 2 s means the stream was admitted.
            return bool(exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED)
        return True

    wait_until(reopened, timeout=20, interval=0.1)


def test_max_concurrent_rpcs(limited: Stub, ns: str) -> None:
    """Open streams count: with 3 in flight the next RPC is refused by gRPC itself."""
    calls = []
    opened: queue.Queue[str] = queue.Queue()
    for i in range(3):
        # A job waits in each stream's namespace, so a delivery tells that the
        # stream is open and holds its slot (a blocking stub starts a
        # server-streaming call only when it is first read).
        assert _enqueue(limited, f"{ns}-{i}") is None
        req = service_pb2.ConsumeRequest(namespace=f"{ns}-{i}", queues=["q"], max_outstanding=1)
        call = limited.Consume(req)
        calls.append(call)
        threading.Thread(target=_read, args=(call, opened), daemon=True).start()
    for _ in range(3):
        assert opened.get(timeout=20) == "delivery"
    # Probes in namespaces of their own: the quotas' refusals are
    # RESOURCE_EXHAUSTED too (before, the enqueue-rate quota's refusal passed
    # for the limit's, and a loaded CI run filled one namespace's job quota).
    probes = itertools.count()

    def probe() -> grpc.RpcError | None:
        return _enqueue(limited, f"{ns}-x{next(probes)}")

    err = probe()
    assert err is not None and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == "Concurrent RPC limit exceeded!"
    for c in calls:
        c.cancel()  # type: ignore[no-untyped-call]
    wait_until(lambda: probe() is None, timeout=20, interval=0.05)


def _read(call: Iterator[service_pb2.ConsumeResponse], opened: queue.Queue[str]) -> None:
    """Reads a stream until it ends; tells ``opened`` of its first delivery."""
    try:
        for resp in call:
            if resp.deliveries:
                opened.put("delivery")
    except grpc.RpcError as err:
        opened.put(f"ended {err.code()}")


def test_max_message_size(limited: Stub, ns: str) -> None:
    big = service_pb2.EnqueueBatchRequest(
        requests=[service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x" * 200_000)] * 6
    )
    with pytest.raises(grpc.RpcError) as info:
        limited.EnqueueBatch(big, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_abusive_pings_are_cut(redis_url: str) -> None:
    """Keepalive enforcement: a client pinging far more often than every 10 s is sent
    GOAWAY (too_many_pings); its idle Consume stream ends with UNAVAILABLE."""
    pinger = [
        ("grpc.keepalive_time_ms", 200),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_time_between_pings_ms", 100),
    ]
    with (
        DelayqProcess(redis_url) as proc,
        grpc.insecure_channel(proc.address, options=pinger) as ch,
    ):
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        call = stub.Consume(
            service_pb2.ConsumeRequest(queues=["idle"], max_outstanding=1), timeout=60
        )
        with pytest.raises(grpc.RpcError) as info:
            next(iter(call))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "ping" in (info.value.details() or "").lower()


def test_unary_enqueue_takes_rate_tokens_in_chunks(redis_url: str, ns: str) -> None:
    """A unary Enqueue makes one Redis call: the rate quota's tokens come from a local
    allowance refilled a chunk at a time (quotas.py), yet the rate still holds."""
    rdb = redis.Redis.from_url(redis_url)
    rdb.config_set("notify-keyspace-events", "Kh")  # every HSET of a hash is published
    sub = rdb.pubsub()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
    sub.subscribe(f"__keyspace@0__:dq:{{ns:{ns}}}:rate")
    assert sub.get_message(timeout=5) is not None  # the subscribe confirmation
    # rate 100/s, burst 200: chunks of min(200 / 20, 100 * 0.05) = 5 tokens.
    args = ["--quota-enqueue-rate", "100", "--quota-enqueue-burst", "200"]
    try:
        with DelayqProcess(redis_url, args) as proc, grpc.insecure_channel(proc.address) as ch:
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            start = time.monotonic()
            outcomes = [_enqueue(stub, ns) for _ in range(300)]
            elapsed = time.monotonic() - start
        admitted = sum(1 for e in outcomes if e is None)
        refused = [e for e in outcomes if e is not None]
        bucket_writes = 0
        while sub.get_message(timeout=0.5) is not None:
            bucket_writes += 1
    finally:
        sub.close()
        rdb.config_set("notify-keyspace-events", "")
        rdb.close()
    # Without chunks every call writes the bucket (300 writes); with them about one
    # write per 5 jobs of the burst, plus one per call once the bucket holds less than
    # a chunk (admitted by the refill, or refused: those take exactly).
    assert bucket_writes <= 200 / 5 + (admitted - 200) + len(refused) + 5
    # The rate holds: the burst plus what refilled while the calls ran (a chunk of slack).
    assert 200 <= admitted <= 200 + 100 * elapsed + 5  # and the whole burst was usable
    assert all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
    if elapsed < 0.9:  # 300 calls faster than the refill: some must have been refused
        assert refused
