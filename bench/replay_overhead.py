"""Redis CPU per script call with and without the lost-reply guard (issue 8).

Runs the same mix through the real Store against a private redis-server:
N single-job enqueues, then claim 10 / ack 10 until drained. Reports Redis'
own `usec_per_call` for EVALSHA (INFO commandstats), so client noise does not
count. "off" leaves only claim guarded (it guards itself). Usage:
`.venv/bin/python -m bench.replay_overhead [jobs] [rounds]`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from typing import Any

from delayq_server.ids import new_job_id
from delayq_server.managed_redis import ManagedRedis
from delayq_server.redis_client import connect as redis_client
from delayq_server.store import JobSpec, LeaseRef, ShardKeys, Store, scripts

ALL = scripts.REPLAYED


def _job() -> JobSpec:
    return JobSpec(new_job_id(0, 1), b"x" * 100, {}, 0, None, 0, 3, 1000, 60_000, 2.0, 0.0, "")


async def _run(url: str, guarded: bool, jobs: int) -> float:
    scripts.REPLAYED = ALL if guarded else frozenset(scripts.SELF_GUARDED)
    scripts.source.cache_clear()
    client = redis_client(url)
    await client.flushall()
    store = Store(client)
    await store.load_scripts()
    await client.config_resetstat()
    keys = ShardKeys("default", "bench", 0)
    sem = asyncio.Semaphore(32)

    async def one() -> None:
        async with sem:
            await store.enqueue(keys, [_job()])

    await asyncio.gather(*(one() for _ in range(jobs)))
    while got := await store.claim(keys, 10, 30_000, "b.1."):
        await store.ack(keys, [LeaseRef(c.job_id, c.nonce) for c in got])
    stats: dict[str, Any] = await client.info("commandstats")
    await client.aclose()
    return float(stats["cmdstat_evalsha"]["usec_per_call"])


async def main(jobs: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data, ManagedRedis(data, appendonly=False) as redis:
        results: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(rounds):
            for guarded in (False, True):
                results[guarded].append(await _run(redis.url, guarded, jobs))
    for guarded, values in results.items():
        best = min(values)
        print(f"guard {'on ' if guarded else 'off'}: EVALSHA {best:.1f} us/call (best of {rounds})")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    asyncio.run(main(*(args + [6000, 3][len(args) :])))
