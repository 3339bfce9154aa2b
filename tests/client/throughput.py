"""Worker drain throughput beside BullMQ's Worker, same machine, same run, same Redis.

Usage: python -m tests.client.throughput [JOBS] [CONCURRENCY]
Starts a redis-server and a delayq server, drains JOBS no-op jobs with delayq.Worker
(batched acks), then runs bench/peers/bullmq_runner.mjs `drain` on the same Redis.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

from delayq import AsyncClient, Delivery, Worker
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis


async def drain_delayq(target: str, jobs: int, concurrency: int) -> float:
    async with AsyncClient(target) as client:
        for start in range(0, jobs, 50_000):
            await client.enqueue_many("bench", [b"x" * 100] * min(50_000, jobs - start))
    worker = Worker(target, concurrency=concurrency, lease=60)
    done = 0

    @worker.handler("bench")
    async def noop(d: Delivery) -> None:
        nonlocal done
        done += 1
        if done == jobs:
            worker.stop()

    started = time.monotonic()
    await worker.serve()
    # Count from Serve start (stream open) to the last ack flushed by the shutdown.
    elapsed = time.monotonic() - started
    assert worker.stats.acked == jobs, worker.stats
    return jobs / elapsed


def drain_bullmq(redis_url: str, jobs: int, concurrency: int) -> float:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        params = {"jobs": jobs, "concurrency": concurrency, "batch_size": 1000}
        params["batch_concurrency"] = 4
        subprocess.run(
            ["node", "bench/peers/bullmq_runner.mjs", "drain", "--redis-url", redis_url,
             "--params", json.dumps(params), "--out", out.name],
            cwd=ROOT, check=True,
        )  # fmt: skip
        return float(json.loads(Path(out.name).read_text())["rate"])


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    with tempfile.TemporaryDirectory() as tmp, ManagedRedis(Path(tmp), appendonly=False) as rs:
        with DelayqProcess(rs.url, ["--log-level", "WARNING"]) as server:
            ours = asyncio.run(drain_delayq(server.address, jobs, concurrency))
        redis.Redis.from_url(rs.url).flushall()
        theirs = drain_bullmq(rs.url, jobs, concurrency)
    print(f"drain {jobs:,} no-op jobs, concurrency {concurrency}:")
    print(f"  delayq.Worker (batched acks): {ours:,.0f} jobs/s")
    print(f"  BullMQ Worker:                {theirs:,.0f} jobs/s")


if __name__ == "__main__":
    main()
