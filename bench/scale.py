"""`make bench-scale`: big backlogs and bursts on one Redis and on a 3-master cluster.

Drives the store (the same Lua scripts the server runs) directly, so the figures
are Redis' and the scripts', not gRPC's:

* Redis bytes per delayed job, 100-byte payloads, due times spread over 30 days;
* enqueue and promote cost per job with a backlog of 10k, then 1M, then 10M
  (BACKLOGS) in place (median of several probes, client-side wall time);
* a burst of jobs due in the same second, promoted and claimed in bounded
  calls: the longest Redis command (SLOWLOG, threshold 1 ms) and the worst
  round trip of a PING every 5 ms while it drains.

Prints a table; `--json` writes the figures. Figures vary on a shared machine:
read medians and ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from delayq_server import redis_client
from delayq_server.ids import new_job_id
from delayq_server.managed_redis import ManagedRedis
from delayq_server.store import JobSpec, ShardKeys, Store

DAY_MS = 86_400_000
PAYLOAD = os.urandom(50).hex().encode()  # 100 bytes
FILL_BATCH = 1000


def _spec(due_ms: int) -> JobSpec:
    return JobSpec(
        job_id=new_job_id(0, 1),
        payload=PAYLOAD,
        headers={},
        delay_ms=None,
        due_at_ms=due_ms,
        ttl_ms=0,
        max_attempts=3,
        backoff_initial_ms=1000,
        backoff_max_ms=60_000,
        multiplier=2.0,
        jitter=0.0,
        idempotency_key="",
    )


async def _used_memory(store: Store) -> int:
    info: Any = await store.redis.info("memory")
    if isinstance(info, dict) and "used_memory" not in info:  # cluster: per node
        return sum(int(v["used_memory"]) for v in info.values())
    return int(info["used_memory"])


async def _fill(store: Store, shards: list[ShardKeys], n: int, now: int, span_ms: int) -> None:
    """n jobs due at pseudo-random times in (now + 1 h, now + span), over the shards."""
    sem = asyncio.Semaphore(8)
    step = 7_919_993  # spreads due times over the span without a random generator

    async def one(batch_no: int) -> None:
        async with sem:
            keys = shards[batch_no % len(shards)]
            base = batch_no * FILL_BATCH
            jobs = [
                _spec(now + 3_600_000 + ((base + i) * step) % span_ms) for i in range(FILL_BATCH)
            ]
            await store.enqueue(keys, jobs, now)

    await asyncio.gather(*(one(b) for b in range(n // FILL_BATCH)))


async def _probe(store: Store, keys: ShardKeys, now: int, span_ms: int) -> tuple[float, float]:
    """Enqueue then promote cost per job (µs): 10 probes of 1,000 jobs due at one instant."""
    enq, pro = [], []
    for p in range(10):
        due = now + 1_000 + p  # before every backlog job: promoted first
        jobs = [_spec(due) for _ in range(1000)]
        t0 = time.perf_counter()
        await store.enqueue(keys, jobs, now)
        enq.append((time.perf_counter() - t0) * 1e6 / 1000)
        t0 = time.perf_counter()
        moved = 0
        while moved < 1000:
            moved += (await store.promote(keys, now_ms=due)).moved
        pro.append((time.perf_counter() - t0) * 1e6 / 1000)
        # Probe jobs leave no trace, so the next memory reading is the backlog's.
        await store.redis.delete(keys.ready)
        async with store.redis.pipeline(transaction=False) as pipe:
            for j in jobs:
                pipe.hdel(keys.record_group(j.job_id), j.job_id)
            await pipe.execute()
    return statistics.median(enq), statistics.median(pro)


async def _burst(store: Store, keys: ShardKeys, n: int, now: int) -> dict[str, float]:
    due = now + 5_000
    for start in range(0, n, FILL_BATCH):
        await store.enqueue(keys, [_spec(due) for _ in range(min(FILL_BATCH, n - start))], now)
    ping_client = redis_client.connect(os.environ["BENCH_REDIS_URL"])
    worst_rtt = 0.0
    done = asyncio.Event()

    async def pinger() -> None:
        nonlocal worst_rtt
        while not done.is_set():
            t0 = time.perf_counter()
            await ping_client.ping()
            worst_rtt = max(worst_rtt, time.perf_counter() - t0)
            await asyncio.sleep(0.005)

    await _slowlog_reset(store)
    task = asyncio.create_task(pinger())
    t0 = time.perf_counter()
    moved = claimed = 0
    while moved < n or claimed < n:
        moved += (await store.promote(keys, now_ms=due)).moved
        got = await store.claim(keys, 500, 60_000, "bench.1.", now_ms=due)
        claimed += len(got)
    drain_s = time.perf_counter() - t0
    done.set()
    await task
    await ping_client.aclose()
    slowest = await _slowlog_max_us(store)
    return {
        "burst_jobs": n,
        "drain_s": drain_s,
        "slowest_command_ms": slowest / 1000,
        "worst_ping_ms": worst_rtt * 1000,
    }


async def _slowlog_reset(store: Store) -> None:
    await store.redis.config_set("slowlog-log-slower-than", 1000)
    await store.redis.slowlog_reset()


async def _slowlog_max_us(store: Store) -> float:
    entries: Any = await store.redis.slowlog_get(1024)
    if isinstance(entries, dict):  # cluster: per node
        entries = [e for node in entries.values() for e in node]
    return max((float(e["duration"]) for e in entries), default=0.0)


async def run(url: str, backlogs: Sequence[int], burst: int, label: str) -> dict[str, Any]:
    os.environ["BENCH_REDIS_URL"] = url
    client = redis_client.connect(url)
    store = Store(client)
    await store.load_scripts()
    now = int(time.time() * 1000)
    shards = [ShardKeys("bench", "scale", s) for s in range(3)]
    out: dict[str, Any] = {"setup": label, "rows": []}
    filled = 0
    base_mem = await _used_memory(store)
    for target in backlogs:
        await _fill(store, shards, target - filled, now, 30 * DAY_MS)
        filled = target
        mem = await _used_memory(store)
        enq_us, pro_us = await _probe(store, shards[0], now, 30 * DAY_MS)
        row = {
            "backlog": filled,
            "bytes_per_job": (mem - base_mem) / filled,
            "enqueue_us_per_job": enq_us,
            "promote_us_per_job": pro_us,
        }
        out["rows"].append(row)
        print(
            f"{label:>8} backlog {filled:>10,}: {row['bytes_per_job']:6.0f} B/job, "
            f"enqueue {enq_us:6.1f} µs/job, promote {pro_us:6.1f} µs/job",
            flush=True,
        )
    out["burst"] = await _burst(store, ShardKeys("bench", "burst", 0), burst, now)
    b = out["burst"]
    print(
        f"{label:>8} burst of {burst:,} due at once: drained in {b['drain_s']:.1f} s, "
        f"slowest Redis command {b['slowest_command_ms']:.2f} ms, "
        f"worst PING {b['worst_ping_ms']:.1f} ms",
        flush=True,
    )
    await client.aclose()
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlogs", default="10000,1000000,10000000")
    parser.add_argument("--burst", type=int, default=1_000_000)
    parser.add_argument("--cluster", action="store_true", help="also on a 3-master cluster")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    backlogs = [int(x) for x in args.backlogs.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        with ManagedRedis(Path(tmp) / "single", appendonly=False) as r:
            results.append(asyncio.run(run(r.url, backlogs, args.burst, "1 node")))
        if args.cluster:
            from tests.support.cluster import ManagedCluster

            with ManagedCluster(Path(tmp) / "cluster") as c:
                results.append(asyncio.run(run(c.url, backlogs, args.burst, "cluster")))
    for res in results:
        first, last = res["rows"][0], res["rows"][-1]
        print(
            f"{res['setup']}: enqueue at {last['backlog']:,} vs {first['backlog']:,} backlog "
            f"{last['enqueue_us_per_job'] / first['enqueue_us_per_job']:.2f}x, promote "
            f"{last['promote_us_per_job'] / first['promote_us_per_job']:.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
