"""`make bench-auth`: enqueue jobs/s through a server with auth off and one with auth on.

Each run gets a fresh redis-server and server (a second idle server on the same
machine skewed the first attempt by start order); runs alternate off/on, the
order swapped every round, so machine noise hits both alike. Reported: the
median of the rounds, single Enqueue (N concurrent callers) and EnqueueBatch.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis


async def _single(address: str, token: str | None, total: int, concurrency: int) -> float:
    md = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        req = service_pb2.EnqueueRequest(queue="bench", payload=b"x" * 100)
        await stub.Enqueue(req, metadata=md)  # warm the token cache and the queue
        left = total

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await stub.Enqueue(req, metadata=md)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start)


async def _batched(address: str, token: str | None, batches: int, size: int) -> float:
    md = (("authorization", f"Bearer {token}"),) if token else ()
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        one = service_pb2.EnqueueRequest(queue="bench-batch", payload=b"x" * 100)
        req = service_pb2.EnqueueBatchRequest(requests=[one] * size)
        await stub.EnqueueBatch(req, metadata=md)
        start = time.perf_counter()
        await asyncio.gather(*(stub.EnqueueBatch(req, metadata=md) for _ in range(batches)))
        return batches * size / (time.perf_counter() - start)


def _run(mode: str, args: argparse.Namespace) -> tuple[float, float]:
    """A fresh redis-server and server per run: no backlog, cache or neighbour carried over."""
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "admin-token"
        flags = {
            "on": ["--auth", "--auth-bootstrap-token-file", str(token_file)],
            "off": [],
            # The enqueue-path quotas (rate bucket, stored-job count) off too: their cost.
            "bare": ["--quota-enqueue-rate", "0", "--quota-jobs", "0"],
        }[mode]
        with (
            ManagedRedis(Path(tmp) / "redis", appendonly=False) as redis,
            DelayqProcess(redis.url, flags) as proc,
        ):
            token = token_file.read_text().strip() if mode == "on" else None
            one = asyncio.run(_single(proc.address, token, args.single, args.concurrency))
            batched = asyncio.run(_batched(proc.address, token, args.batches, args.batch_size))
            return one, batched


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.auth", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--single", type=int, default=5000, help="Enqueue calls per round")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20, help="EnqueueBatch calls per round")
    ap.add_argument("--batch-size", type=int, default=1000)
    args = ap.parse_args()
    modes = ["bare", "off", "on"]
    results: dict[str, list[float]] = {f"{m} {k}": [] for m in modes for k in "1b"}
    for _ in range(args.rounds):
        modes = modes[1:] + modes[:1]  # each mode goes first in turn
        for mode in modes:
            one, batched = _run(mode, args)
            results[f"{mode} 1"].append(one)
            results[f"{mode} b"].append(batched)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"rounds: {args.rounds} (alternating), median jobs/s")
    print("| API | no auth, no enqueue quotas | auth off (min-max) | auth on (min-max) | on/off |")
    print("|---|---|---|---|---|")
    for api, key in (
        (f"Enqueue x{args.concurrency} concurrent", "1"),
        (f"EnqueueBatch of {args.batch_size}", "b"),
    ):
        a, b = med[f"off {key}"], med[f"on {key}"]
        off_r, on_r = results[f"off {key}"], results[f"on {key}"]
        print(
            f"| {api} | {med[f'bare {key}']:,.0f} "
            f"| {a:,.0f} ({min(off_r):,.0f}-{max(off_r):,.0f}) "
            f"| {b:,.0f} ({min(on_r):,.0f}-{max(on_r):,.0f}) | {b / a:.2f} |"
        )


if __name__ == "__main__":
    main()
