"""`make bench-enqueue-calls`: the Redis time of each enqueue script call.

Issue 12 bounds one Redis call at 2 ms of Redis time, so a batch must not stall the
other clients of a node. This fills one shard of a fresh redis-server with
`--backlog` jobs due over 30 days through the Store (so with the server's own
chunking, store/chunks.py), then stores `--batches` batches of 1,000 jobs in each of
three shapes and prints the enqueue script calls' Redis time from INFO latencystats
and commandstats (only this process runs scripts there): p50, p99 and max per call,
script calls per batch and Redis time per job.

- spread: each job its own due time, at random over 30 days;
- one delay: the whole batch one delay (one due time);
- in order: due times rising 1 ms per job (a producer scheduling a stream of events).

`--backlog` 1,000,000 takes about a minute to fill. The figures are Redis' own
execution time, so the machine's load moves them less than wall clock; still, quote
medians of several runs.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.scale_probe import spec
from delayq_server import redis_client
from delayq_server.managed_redis import ManagedRedis
from delayq_server.store import ShardKeys, Store
from delayq_server.store.store import JobSpec

DAY_MS = 86_400_000
BATCH = 1000


def _job(delay_ms: int, payload: bytes) -> JobSpec:
    """bench-scale's job, but by delay: a batch's calls may then run together, and
    jobs of one delay share a due time (enqueue.lua's bucket memo)."""
    job = spec(0, payload)
    job.delay_ms, job.due_at_ms = delay_ms, None
    return job


SHAPES: dict[str, Callable[[random.Random], list[int]]] = {
    "spread": lambda rng: [rng.randrange(3_600_000, 30 * DAY_MS) for _ in range(BATCH)],
    "one delay": lambda rng: [rng.randrange(3_600_000, 30 * DAY_MS)] * BATCH,
    "in order": lambda rng: [3_600_000 + rng.randrange(1000) + i for i in range(BATCH)],
}


async def _store_batches(
    store: Store, keys: ShardKeys, delays: list[list[int]], payload: bytes
) -> None:
    for batch in delays:
        await store.enqueue(keys, [_job(d, payload) for d in batch])


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    payload = b"x" * args.payload_bytes
    with ManagedRedis(Path(tempfile.mkdtemp(prefix="delayq-enq-calls-")), appendonly=False) as rds:
        client = redis_client.connect(rds.url)
        store = Store(client, default_shards=1)
        await store.load_scripts()
        keys = ShardKeys("bench", "calls", 0)
        t0 = time.perf_counter()
        fill = [SHAPES["spread"](rng) for _ in range(args.backlog // BATCH)]
        await _store_batches(store, keys, fill, payload)
        print(f"backlog of {args.backlog:,} jobs over 30 days in {time.perf_counter() - t0:.0f} s")
        # p100 is the slowest call (HdrHistogram, within about 1%).
        await client.config_set("latency-tracking-info-percentiles", "50 99 100")
        for name, shape in SHAPES.items():
            batches = [shape(rng) for _ in range(args.batches)]
            await client.config_resetstat()
            await _store_batches(store, keys, batches, payload)
            stats = (await client.info("commandstats"))["cmdstat_evalsha"]
            pct = (await client.info("latencystats"))["latency_percentiles_usec_evalsha"]
            jobs = args.batches * BATCH
            print(
                f"{name:>9}: {stats['calls'] / args.batches:5.1f} calls per 1,000-job batch; "
                f"Redis time per call p50 {pct['p50'] / 1000:.2f} ms, "
                f"p99 {pct['p99'] / 1000:.2f} ms, max {pct['p100'] / 1000:.2f} ms; "
                f"{stats['usec'] / jobs:.1f} µs per job"
            )
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", type=int, default=1_000_000, help="jobs in place first")
    parser.add_argument("--batches", type=int, default=20, help="1,000-job batches per shape")
    parser.add_argument("--payload-bytes", type=int, default=100)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
