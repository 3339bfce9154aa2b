"""Wake-ups at scale: a ready job wakes one idle stream, not all of them, and
2,000 open streams share a burst fairly without a claim storm or pool errors."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
import redis
from google.protobuf import duration_pb2

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ManagedRedis]:
    with ManagedRedis(tmp_path, appendonly=False) as r:
        yield r


def _script_calls(client: redis.Redis) -> int:
    stats: dict[str, dict[str, int]] = client.info("commandstats")
    return sum(stats.get(c, {}).get("calls", 0) for c in ("cmdstat_evalsha", "cmdstat_eval"))


async def _until(pred: Callable[[], bool], within: float = 110.0) -> None:
    """Polls ``pred``; fails the test after ``within`` seconds (below pytest's timeout)."""
    deadline = asyncio.get_running_loop().time() + within
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met")
        await asyncio.sleep(0.01)


class Streams:
    """n Consume streams of max_outstanding 1 on one channel; each acks what it gets."""

    def __init__(self, stub: service_pb2_grpc.DelayQueueServiceAsyncStub, queue: str) -> None:
        self.stub, self.queue = stub, queue
        self.got: Counter[int] = Counter()
        self.warm: set[int] = set()  # streams holding a warm-up job
        self.warmed = asyncio.Event()  # set: let go of the warm-up jobs
        self.errors: list[str] = []
        self.opened = 0

    async def one(self, i: int) -> None:
        req = service_pb2.ConsumeRequest(
            queues=[self.queue],
            max_outstanding=1,
            lease_duration=duration_pb2.Duration(seconds=600),  # a slow warm-up never expires
        )
        call = self.stub.Consume(req)
        self.opened += 1
        try:
            async for resp in call:
                for d in resp.deliveries:
                    if d.job.payload == b"warm-up":
                        # Proof the server has this stream; hold it until every
                        # stream has one, so the burst finds them all open.
                        self.warm.add(i)
                        await self.warmed.wait()
                    else:
                        self.got[i] += 1
                    await self.stub.Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]))
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.errors.append(f"{exc.code().name}: {exc.details()}")

    @property
    def total(self) -> int:
        return sum(self.got.values())


@asynccontextmanager
async def _open(address: str, queue: str, n: int) -> AsyncIterator[Streams]:
    async with grpc.aio.insecure_channel(address) as ch:
        streams = Streams(service_pb2_grpc.DelayQueueServiceStub(ch), queue)
        tasks = [asyncio.create_task(streams.one(i)) for i in range(n)]
        try:
            await _until(lambda: streams.opened == n)
            yield streams
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _enqueue(
    stub: service_pb2_grpc.DelayQueueServiceAsyncStub, queue: str, n: int, payload: bytes = b"x"
) -> None:
    for start in range(0, n, 1000):
        reqs = [
            service_pb2.EnqueueRequest(queue=queue, payload=payload)
            for _ in range(min(1000, n - start))
        ]
        resp = await stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs), timeout=30)
        assert all(r.HasField("response") for r in resp.results)


async def test_one_ready_job_wakes_one_of_200_idle_streams(own_redis: ManagedRedis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    # No stream quota: the 200 streams' slot renewals (every 10 s, together) would
    # land in the counted window on a machine slow enough to open them in ~9 s.
    with DelayqProcess(own_redis.url, ["--quota-streams", "0"]) as server:
        async with (
            grpc.aio.insecure_channel(server.address) as ch,
            _open(server.address, "wake", 200) as streams,
        ):
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            await _enqueue(stub, "wake", 1)
            await _until(lambda: streams.total == 1)
            # Every stream looked once when it opened; wait for calls to settle.
            for _ in range(100):
                before = _script_calls(client)
                await asyncio.sleep(0.2)
                if _script_calls(client) - before < 5:
                    break
            before = _script_calls(client)
            for n in range(2, 7):
                await _enqueue(stub, "wake", 1)
                await _until(lambda n=n: streams.total == n)  # type: ignore[misc]
            calls = _script_calls(client) - before
    client.close()
    print(f"5 jobs to 200 idle streams: {calls} script calls")
    assert not streams.errors, streams.errors[:3]
    # Per job: the enqueue, a claim (two if a stream raced), an ack; plus the
    # replica's background calls (ownership renewals, heartbeats, one a second
    # each, more of them on a slow machine). Waking every stream would cost 200+
    # claims per job, over 1,000 for the five.
    assert calls < 200, calls


async def test_2000_streams_share_a_burst_fairly(own_redis: ManagedRedis) -> None:
    """2,000 streams over two replicas (one grpc.aio process serves about 1,800
    concurrent streams on this machine: docs/decisions.md, wake-ups)."""
    per_replica, jobs = 1000, 6000
    args = ["--quota-streams", "0"]  # the namespace default allows 1,000 streams
    with DelayqProcess(own_redis.url, args) as a, DelayqProcess(own_redis.url, args) as b:
        async with (
            grpc.aio.insecure_channel(a.address) as ch,
            _open(a.address, "burst", per_replica) as on_a,
            _open(b.address, "burst", per_replica) as on_b,
        ):
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            await _enqueue(stub, "burst", 2 * per_replica, b"warm-up")
            await _until(lambda: len(on_a.warm) + len(on_b.warm) == 2 * per_replica)
            await _enqueue(stub, "burst", jobs)
            on_a.warmed.set()
            on_b.warmed.set()
            await _until(lambda: on_a.total + on_b.total >= jobs)
        log = "".join(a.output) + "".join(b.output)
    counts = [s.got[i] for s in (on_a, on_b) for i in range(per_replica)]
    spread = (min(counts), statistics.median(counts), max(counts))
    print(f"{jobs} jobs over {len(counts)} streams: min/median/max per stream {spread}")
    assert not on_a.errors and not on_b.errors, (on_a.errors + on_b.errors)[:3]
    assert "Redis unavailable" not in log and "Too many connections" not in log
    assert sum(counts) == jobs
    assert min(counts) >= 1  # every stream took part
