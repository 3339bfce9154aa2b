"""delayq side of the benchmark: one scenario per process, over the raw gRPC stubs (asyncio)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, overload

# The redelivery scenario forks worker A from a process that uses gRPC; the child execs at
# once, so gRPC's fork handlers (and their warning) are not needed.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc
import uvloop
from google.protobuf import duration_pb2

from bench.harness.common import (
    PAYLOAD,
    QUEUE,
    Holder,
    LatenessLog,
    Progress,
    due_times_ms,
    runner_args,
    write_result,
)
from delayq import AsyncClient
from delayq.v1 import job_pb2, service_pb2, service_pb2_grpc

PAYLOAD_BYTES = PAYLOAD.encode()
# Large enough for a 1000-job batch or a 1000-delivery stream message.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]

if TYPE_CHECKING:
    Stub = service_pb2_grpc.DelayQueueServiceAsyncStub


def _request(
    *, delay_s: float | None = None, due_ns: int | None = None
) -> service_pb2.EnqueueRequest:
    req = service_pb2.EnqueueRequest(queue=QUEUE, payload=PAYLOAD_BYTES)
    if due_ns is not None:
        req.due_time.FromNanoseconds(due_ns)
    elif delay_s is not None and delay_s > 0:
        req.delay.FromNanoseconds(int(delay_s * 1e9))
    return req


class BuiltOnSend(Sequence[service_pb2.EnqueueRequest]):
    """Requests for the given delays, each built when its batch is sliced off to be
    sent: the producer builds batch k+1 while the server stores batch k, as one reading
    from a source would. The BullMQ runner builds its addBulk chunks the same way."""

    def __init__(self, delays_s: list[float]) -> None:
        self._delays = delays_s

    def __len__(self) -> int:
        return len(self._delays)

    @overload
    def __getitem__(self, i: int) -> service_pb2.EnqueueRequest: ...
    @overload
    def __getitem__(self, i: slice) -> list[service_pb2.EnqueueRequest]: ...
    def __getitem__(
        self, i: int | slice
    ) -> service_pb2.EnqueueRequest | list[service_pb2.EnqueueRequest]:
        if isinstance(i, slice):
            return [_request(delay_s=d) for d in self._delays[i]]
        return _request(delay_s=self._delays[i])


def _check_batch(resp: service_pb2.EnqueueBatchResponse) -> None:
    for result in resp.results:
        if result.HasField("error"):
            raise RuntimeError(f"EnqueueBatch refused a job: {result.error.message}")


async def enqueue_batched(
    stub: Stub,
    requests: Sequence[service_pb2.EnqueueRequest],
    *,
    batch_size: int,
    concurrency: int,
    on_batch: Callable[[int, float], None] | None = None,
) -> None:
    """Send `requests` in batches of `batch_size`, `concurrency` calls in flight."""
    sem = asyncio.Semaphore(concurrency)
    done = 0

    async def one(start: int) -> None:
        nonlocal done
        async with sem:
            chunk = requests[start : start + batch_size]
            resp = await stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=chunk))
            _check_batch(resp)
            done += len(chunk)
            if on_batch is not None:
                on_batch(start + len(chunk), time.time())

    await asyncio.gather(*(one(i) for i in range(0, len(requests), batch_size)))


async def open_client(target: str) -> AsyncClient:
    """An AsyncClient whose channel is connected, as BullMQ's runner awaits
    `queue.waitUntilReady()` before its clock starts."""
    client = AsyncClient(target)
    await client._channel.channel_ready()
    return client


async def enqueue_client(
    client: AsyncClient, jobs: int, *, concurrency: int, delay_s: float
) -> None:
    """`concurrency` callers of the Python AsyncClient's enqueue (client-side batching on)."""
    next_index = 0
    progress = Progress("delayq enqueue (AsyncClient.enqueue)", jobs)

    async def caller() -> None:
        nonlocal next_index
        while next_index < jobs:
            next_index += 1
            await client.enqueue(QUEUE, PAYLOAD_BYTES, delay=delay_s)
            progress.update(next_index)

    await asyncio.gather(*(caller() for _ in range(concurrency)))


async def enqueue_latency(stub: Stub, jobs: int, *, delay_s: float) -> list[float]:
    """One unary Enqueue at a time: the latency of each call, in ms."""
    out: list[float] = []
    for _ in range(jobs):
        start = time.perf_counter_ns()
        await stub.Enqueue(_request(delay_s=delay_s))
        out.append((time.perf_counter_ns() - start) / 1e6)
    return out


async def enqueue_client_latency(client: AsyncClient, jobs: int, *, delay_s: float) -> list[float]:
    """One AsyncClient.enqueue at a time (a message on its EnqueueStream): each one's
    latency, in ms. The stream opens on the first call, outside the figures."""
    await client.enqueue(QUEUE, PAYLOAD_BYTES, delay=delay_s)
    out: list[float] = []
    for _ in range(jobs):
        start = time.perf_counter_ns()
        await client.enqueue(QUEUE, PAYLOAD_BYTES, delay=delay_s)
        out.append((time.perf_counter_ns() - start) / 1e6)
    return out


async def enqueue_single(stub: Stub, jobs: int, *, concurrency: int, delay_s: float) -> None:
    """Unary Enqueue calls over the raw stub, `concurrency` in flight."""
    next_index = 0
    progress = Progress("delayq enqueue (single)", jobs)

    async def worker() -> None:
        nonlocal next_index
        while next_index < jobs:
            next_index += 1
            await stub.Enqueue(_request(delay_s=delay_s))
            progress.update(next_index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


# Acks wait up to this long to share one Ack call, as the Pub/Sub subscriber batches
# its acks (10 ms): at 1,000 deliveries/s one call per delivery would cost the
# server a unary call (about 1 ms of CPU at that pace, bench/timer_floor.py) per job
# (issue 12, timer CPU).
ACK_LINGER_S = 0.01
# Tokens that go at once, without the linger: a backlog of acks (a drain) is sent as
# fast as calls return, as before the linger; 100 is the server's ack chunk.
ACK_AT_ONCE = 100


class Consumer:
    """One Consume stream; acks in batches as tokens pile up (one Ack call in flight,
    gathered for up to ACK_LINGER_S)."""

    def __init__(
        self,
        stub: Stub,
        *,
        max_outstanding: int,
        max_batch: int,
        lease_s: int = 30,
        ack_linger_s: float = ACK_LINGER_S,
    ) -> None:
        self.stub = stub
        self.request = service_pb2.ConsumeRequest(
            queues=[QUEUE],
            max_outstanding=max_outstanding,
            max_batch=max_batch,
            lease_duration=duration_pb2.Duration(seconds=lease_s),
        )
        self.pending: list[str] = []
        self.wake = asyncio.Event()
        self.received = 0
        self.acked = 0
        # What the server's process handled (bench/timer_floor.py replays these rates).
        self.messages = 0
        self.message_bytes = 0
        self.ack_calls = 0
        self.ack_bytes = 0
        self.ack_linger_s = ack_linger_s

    async def acker(self) -> None:
        while True:
            await self.wake.wait()
            if self.ack_linger_s > 0 and len(self.pending) < ACK_AT_ONCE:
                await asyncio.sleep(self.ack_linger_s)
            self.wake.clear()
            # One call of what gathered; fewer than ACK_AT_ONCE tokens that arrive
            # during it wait for the next linger (sending them at once made two calls
            # per linger at 1,000 jobs/s, issue 12).
            tokens, self.pending = self.pending[:1000], self.pending[1000:]
            if self.pending:
                self.wake.set()
            if not tokens:
                continue
            req = service_pb2.AckRequest(lease_tokens=tokens)
            self.ack_calls += 1
            self.ack_bytes += req.ByteSize()
            resp = await self.stub.Ack(req)
            bad = sum(1 for r in resp.results if r != service_pb2.ACK_RESULT_ACKED)
            if bad:
                raise RuntimeError(f"{bad} of {len(tokens)} acks refused")
            self.acked += len(tokens)

    def count(self, resp: service_pb2.ConsumeResponse) -> None:
        """One stream message the server wrote (bench/timer_floor.py replays the rate)."""
        self.messages += 1
        self.message_bytes += resp.ByteSize()

    async def run(self, on_delivery: Callable[[job_pb2.Delivery], None], until: int) -> None:
        """Consume and ack until `until` jobs have been acked."""
        call = self.stub.Consume(self.request)
        acker = asyncio.create_task(self.acker())
        try:
            async for resp in call:
                for delivery in resp.deliveries:
                    on_delivery(delivery)
                    self.pending.append(delivery.lease_token)
                self.received += len(resp.deliveries)
                self.count(resp)
                self.wake.set()
                if self.received >= until:
                    break
            while self.acked < until:
                if acker.done():
                    acker.result()
                await asyncio.sleep(0.001)
        finally:
            acker.cancel()
            call.cancel()


def delays(p: dict[str, Any]) -> list[float]:
    """Per-job delays: 1 h, or spread at random over `spread_s` after one minute."""
    jobs = int(p["jobs"])
    spread = float(p.get("spread_s", 0))
    if not spread:
        return [float(p.get("delay_s", 3600))] * jobs
    rng = random.Random(12)
    return [60 + rng.random() * spread for _ in range(jobs)]


async def scenario_enqueue(stub: Stub, p: dict[str, Any], target: str) -> dict[str, Any]:
    jobs = int(p["jobs"])
    delay_s = float(p.get("delay_s", 3600))
    if p["mode"] == "single":
        async with await open_client(target) as client:
            start = time.perf_counter()
            await enqueue_client(client, jobs, concurrency=int(p["concurrency"]), delay_s=delay_s)
            seconds = time.perf_counter() - start
        return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds}
    if p["mode"] in ("latency", "client_latency"):  # one call at a time: the p50
        if p["mode"] == "latency":
            start = time.perf_counter()
            lat = await enqueue_latency(stub, jobs, delay_s=delay_s)
        else:
            async with await open_client(target) as client:
                start = time.perf_counter()
                lat = await enqueue_client_latency(client, jobs, delay_s=delay_s)
        seconds = time.perf_counter() - start
        return {
            "jobs": jobs,
            "seconds": seconds,
            "rate": jobs / seconds,
            "p50_ms": statistics.median(lat),
        }
    start = time.perf_counter()
    if p["mode"] == "unary":
        await enqueue_single(stub, jobs, concurrency=int(p["concurrency"]), delay_s=delay_s)
    else:
        progress = Progress("delayq enqueue (batched)", jobs)
        await enqueue_batched(
            stub,
            BuiltOnSend(delays(p)),
            batch_size=int(p["batch_size"]),
            concurrency=int(p["batch_concurrency"]),
            on_batch=lambda n, _t: progress.update(n),
        )
    seconds = time.perf_counter() - start
    return {"jobs": jobs, "seconds": seconds, "rate": jobs / seconds}


async def scenario_lateness(stub: Stub, p: dict[str, Any]) -> dict[str, Any]:
    rate = float(p["rate"])
    jobs = int(p["jobs"])
    due_ns = [ms * 1_000_000 for ms in due_times_ms(float(p["lead_s"]), jobs, rate)]
    log = LatenessLog(
        f"delayq lateness @{rate:,.0f}/s",
        jobs,
        "consumer: time.time_ns() when the delivery arrives - requested due time",
    )

    def on_delivery(d: job_pb2.Delivery) -> None:
        # Receipt on the consumer's clock (same host as Redis), sub-ms; the requested
        # due time is a whole ms, so Job.due_time is exactly what was asked for.
        log.record(d.job.id, (time.time_ns() - d.job.due_time.ToNanoseconds()) / 1e6)

    consumer = Consumer(
        stub, max_outstanding=int(p["max_outstanding"]), max_batch=int(p["max_batch"])
    )
    consume = asyncio.create_task(consumer.run(on_delivery, jobs))

    def on_batch(end: int, now: float) -> None:
        # A batch stored after the due time of its first job would skew lateness.
        start = max(end - int(p["batch_size"]), 0)
        if now * 1e9 > due_ns[start]:
            log.late_enqueues += end - start

    await enqueue_batched(
        stub,
        [_request(due_ns=d) for d in due_ns],
        batch_size=int(p["batch_size"]),
        concurrency=int(p["batch_concurrency"]),
        on_batch=on_batch,
    )
    timeout = float(p["lead_s"]) + jobs / rate + float(p.get("grace_s", 60))
    await asyncio.wait_for(consume, timeout)
    return log.result()


async def scenario_drain(stub: Stub, p: dict[str, Any]) -> dict[str, Any]:
    jobs = int(p["jobs"])
    await enqueue_batched(
        stub,
        [_request() for _ in range(jobs)],
        batch_size=int(p["batch_size"]),
        concurrency=int(p["batch_concurrency"]),
    )
    progress = Progress("delayq drain", jobs)
    received = 0

    def on_delivery(_d: job_pb2.Delivery) -> None:
        nonlocal received
        received += 1
        progress.update(received)

    consumers = [
        Consumer(stub, max_outstanding=int(p["max_outstanding"]), max_batch=int(p["max_batch"]))
        for _ in range(int(p.get("streams", 1)))
    ]
    start = time.perf_counter()
    tasks = [asyncio.create_task(c.run(on_delivery, jobs // len(consumers))) for c in consumers]
    await asyncio.gather(*tasks)
    seconds = time.perf_counter() - start
    acked = sum(c.acked for c in consumers)
    return {"jobs": jobs, "acked": acked, "seconds": seconds, "rate": acked / seconds}


async def first_delivery(call: Any) -> job_pb2.Delivery:
    async for resp in call:
        for delivery in resp.deliveries:
            got: job_pb2.Delivery = delivery
            return got
    raise RuntimeError("Consume stream ended without a delivery")


async def scenario_hold(stub: Stub, _p: dict[str, Any]) -> dict[str, Any]:
    """Worker A of the redelivery scenario: take one job and never ack it."""
    call = stub.Consume(
        service_pb2.ConsumeRequest(
            queues=[QUEUE], max_outstanding=1, lease_duration=duration_pb2.Duration(seconds=30)
        )
    )
    delivery = await first_delivery(call)
    print(f"held {delivery.job.id}", flush=True)
    await asyncio.sleep(3600)
    return {}


async def scenario_redelivery(stub: Stub, p: dict[str, Any], args: Any) -> dict[str, Any]:
    timeout = float(p["timeout_s"])
    async with Holder(
        *(sys.executable, "-m", "bench.harness.delayq_runner", "hold"),
        *("--redis-url", args.redis_url, "--target", args.target),
    ) as holder:
        await stub.Enqueue(_request())
        held_id = await holder.held()
        # Worker B is connected and idle before A dies.
        call = stub.Consume(
            service_pb2.ConsumeRequest(
                queues=[QUEUE], max_outstanding=1, lease_duration=duration_pb2.Duration(seconds=30)
            )
        )
        got = asyncio.create_task(first_delivery(call))
        await asyncio.sleep(0.5)
        killed = holder.kill(str(p.get("signal", "KILL")))
        try:
            delivery = await asyncio.wait_for(got, timeout)
        except TimeoutError:
            return {"seconds": None, "timeout_s": timeout}
        seconds = time.perf_counter() - killed
        call.cancel()
    if delivery.job.id != held_id:
        raise RuntimeError(f"worker B got {delivery.job.id}, not the held job {held_id}")
    return {"seconds": seconds, "timeout_s": timeout, "attempt": delivery.attempt}


async def main() -> None:
    args = runner_args(__doc__ or "")
    params: dict[str, Any] = json.loads(args.params)
    async with grpc.aio.insecure_channel(args.target, options=CHANNEL_OPTIONS) as channel:
        stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        # Connected before any clock starts, as BullMQ's runner awaits
        # queue.waitUntilReady() before its own.
        await channel.channel_ready()
        scenario = args.scenario
        if scenario == "enqueue":
            result = await scenario_enqueue(stub, params, args.target)
        elif scenario == "lateness":
            result = await scenario_lateness(stub, params)
        elif scenario == "drain":
            result = await scenario_drain(stub, params)
        elif scenario == "redelivery":
            result = await scenario_redelivery(stub, params, args)
        elif scenario == "hold":
            result = await scenario_hold(stub, params)
        else:
            raise SystemExit(f"unknown scenario {scenario!r}")
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    uvloop.run(main())
