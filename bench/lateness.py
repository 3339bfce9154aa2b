"""Due-time lateness through the real server: ~RATE jobs/s falling due for DURATION s.

    python -m bench.lateness [--rate 1000] [--duration 30] [--quick]

Starts its own redis-server and delayq server, schedules every job ahead of
time (batched), consumes them on one stream with batched acks, and prints
lateness p50/p99/max on the server clock (claim time - due time, both Redis
TIME) and on the worker's clock (arrival - due), plus early deliveries (must
be 0). Run `make bench` for the side-by-side comparison with peers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import uvloop

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

PAYLOAD = b"x" * 100
LEAD_S = 3.0  # schedule everything this far ahead so enqueueing never overlaps due times


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def run(address: str, rate: int, duration: float) -> tuple[list[float], list[float]]:
    total = int(rate * duration)
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        start_ns = time.time_ns() + int(LEAD_S * 1e9)
        due_ms: dict[str, int] = {}
        for first in range(0, total, 1000):
            reqs = []
            for i in range(first, min(total, first + 1000)):
                r = service_pb2.EnqueueRequest(queue="lateness", payload=PAYLOAD)
                r.due_time.FromNanoseconds(start_ns + int(i * 1e9 / rate))
                reqs.append(r)
            resp = await stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs))
            for res in resp.results:
                due_ms[res.response.job_id] = res.response.due_time.ToMilliseconds()
        print(f"scheduled {total} jobs; due from +{LEAD_S:.0f}s for {duration:.0f}s", flush=True)
        server_late: list[float] = []
        client_late: list[float] = []
        stream = stub.Consume(service_pb2.ConsumeRequest(queues=["lateness"], max_outstanding=5000))
        pending: list[str] = []
        done = asyncio.Event()

        async def acker() -> None:
            # Acks off the receive path, many tokens per call (as a real worker would).
            while not (done.is_set() and not pending):
                if pending:
                    batch = pending[:1000]
                    del pending[:1000]
                    await stub.Ack(service_pb2.AckRequest(lease_tokens=batch))
                else:
                    await asyncio.sleep(0.005)

        ack_task = asyncio.create_task(acker())
        last_report = time.monotonic()
        async for msg in stream:
            arrived_ms = time.time_ns() / 1e6
            for d in msg.deliveries:
                due = due_ms[d.job.id]
                server_late.append(d.job.last_delivery_time.ToMilliseconds() - due)
                client_late.append(arrived_ms - due)
                pending.append(d.lease_token)
            if time.monotonic() - last_report > 5:
                last_report = time.monotonic()
                print(f"  {len(server_late)}/{total} delivered", file=sys.stderr, flush=True)
            if len(server_late) >= total:
                break
        done.set()
        await ack_task
        stream.cancel()
    return server_late, client_late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="jobs falling due per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of due jobs")
    parser.add_argument("--quick", action="store_true", help="5 s instead of 30 s")
    args = parser.parse_args()
    duration = 5.0 if args.quick else args.duration
    with (
        tempfile.TemporaryDirectory(prefix="delayq-bench-") as tmp,
        ManagedRedis(Path(tmp), appendonly=False) as redis,
        DelayqProcess(redis.url) as server,
    ):
        server_late, client_late = uvloop.run(run(server.address, args.rate, duration))
    print(f"\ndelayq due-time lateness, {args.rate} jobs/s due for {duration:.0f} s")
    print(f"{'clock':<26}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'early':>7}")
    for label, values in (
        ("server (claim - due)", server_late),
        ("worker (arrival - due)", client_late),
    ):
        early = sum(1 for v in values if v < 0)
        print(
            f"{label:<26}{statistics.median(values):8.1f}{pct(values, 99):8.1f}"
            f"{max(values):8.1f}{early:7d}"
        )


if __name__ == "__main__":
    main()
