"""Small helpers for driving the server with the generated stubs in tests."""

from __future__ import annotations

import queue as queue_mod
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import job_pb2, service_pb2, service_pb2_grpc

Stub = service_pb2_grpc.DelayQueueServiceStub


def in_seconds(n: int) -> timestamp_pb2.Timestamp:
    """A due time n seconds from now (local clock; tests use it far from boundaries)."""
    t = timestamp_pb2.Timestamp()
    t.GetCurrentTime()
    t.seconds += n
    return t


def ms(n: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=n // 1000, nanos=(n % 1000) * 1_000_000)


def enqueue(stub: Stub, queue: str, payload: bytes = b"job", **kw: object) -> str:
    resp = stub.Enqueue(service_pb2.EnqueueRequest(queue=queue, payload=payload, **kw), timeout=10)  # type: ignore[arg-type]
    return resp.job_id


def query(stub: Stub, queue: str, job_id: str) -> job_pb2.Job:
    return stub.Query(service_pb2.QueryRequest(queue=queue, job_id=job_id), timeout=10).job


def stats(stub: Stub, queue: str) -> job_pb2.QueueStats:
    return stub.GetQueueStats(service_pb2.GetQueueStatsRequest(queue=queue), timeout=10).stats


def ack(stub: Stub, *tokens: str) -> list[int]:
    return list(stub.Ack(service_pb2.AckRequest(lease_tokens=tokens), timeout=10).results)


def release(stub: Stub, *tokens: str) -> list[int]:
    return list(stub.Release(service_pb2.ReleaseRequest(lease_tokens=tokens), timeout=10).results)


@dataclass
class Consumer:
    """A Consume stream read on a thread; deliveries land in a queue with their arrival time."""

    stub: Stub
    queues: list[str]
    max_outstanding: int = 100
    lease_ms: int = 30_000
    release_grace_ms: int = 0
    received: queue_mod.Queue[tuple[float, job_pb2.Delivery]] = field(
        default_factory=queue_mod.Queue
    )
    error: grpc.RpcError | None = None

    def __post_init__(self) -> None:
        req = service_pb2.ConsumeRequest(
            queues=self.queues,
            max_outstanding=self.max_outstanding,
            lease_duration=ms(self.lease_ms),
        )
        if self.release_grace_ms:
            req.release_grace.CopyFrom(ms(self.release_grace_ms))
        self.call = self.stub.Consume(req)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for resp in self.call:
                now = time.time()
                for d in resp.deliveries:
                    self.received.put((now, d))
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = exc

    def take(self, n: int = 1, timeout: float = 10.0) -> list[job_pb2.Delivery]:
        return [d for _, d in self.take_timed(n, timeout)]

    def take_timed(self, n: int = 1, timeout: float = 10.0) -> list[tuple[float, job_pb2.Delivery]]:
        deadline = time.monotonic() + timeout
        out: list[tuple[float, job_pb2.Delivery]] = []
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"got {len(out)} of {n} deliveries within {timeout}s")
            try:
                out.append(self.received.get(timeout=left))
            except queue_mod.Empty:
                continue
        return out

    def close(self) -> None:
        self.call.cancel()  # type: ignore[no-untyped-call]
        self.thread.join(5)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def consumer(stub: Stub, *queues: str, **kw: object) -> Iterator[Consumer]:
    c = Consumer(stub, list(queues), **kw)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        c.close()
