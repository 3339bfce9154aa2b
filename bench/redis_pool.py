"""Client CPU per Redis script call through redis-py's pools and the server's QuickPool.

`python -m bench.redis_pool` starts a fresh redis-server and times sequential EVALSHA
calls of a one-line script (the shape of a claim or an Ack) through
BlockingConnectionPool (what the server used before), ConnectionPool, and QuickPool
(delayq_server/redis_client.py) with redis-py's packer and write and with its own, interleaved in
rounds under uvloop as the server runs. It prints the median over rounds of the
client's CPU and wall time per call. Issue 12; docs/decisions.md has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
import uvloop

from delayq_server.managed_redis import ManagedRedis
from delayq_server.redis_client import POOL_SIZE, QuickPool


class QuickPoolRedisPyWrite(QuickPool):
    """QuickPool with redis-py's own packer and write (a Task per command for its timeout), as
    before the quick write (redis_client.py, `_QuickWrite`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # quick_connection_class(base) is a subclass of (_QuickWrite, base).
        self.connection_class = self.connection_class.__bases__[-1]


POOLS: dict[str, type[aioredis.ConnectionPool]] = {
    "BlockingConnectionPool": aioredis.BlockingConnectionPool,
    "ConnectionPool": aioredis.ConnectionPool,
    "QuickPool, redis-py's packer and write": QuickPoolRedisPyWrite,
    "QuickPool": QuickPool,
}


async def _calls(
    pool_class: type[aioredis.ConnectionPool], url: str, n: int
) -> tuple[float, float]:
    """(CPU us, wall us) per call over `n` sequential calls, after a warm-up."""
    pool = pool_class.from_url(url, max_connections=POOL_SIZE, health_check_interval=30)
    client = aioredis.Redis.from_pool(pool)
    try:
        sha = await client.script_load("return 1")
        for _ in range(500):
            await client.evalsha(sha, 0)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(n):
            await client.evalsha(sha, 0)
        return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6
    finally:
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=10_000, help="calls per pool per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in POOLS}
    with tempfile.TemporaryDirectory() as tmp, ManagedRedis(Path(tmp), appendonly=False) as r:
        for _ in range(args.rounds):
            for name, cls in POOLS.items():
                figures[name].append(uvloop.run(_calls(cls, r.url, args.calls)))
    print("| pool | client CPU us/call | wall us/call |")
    print("|---|---|---|")
    for name, runs in figures.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"| {name} | {cpu:.1f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
