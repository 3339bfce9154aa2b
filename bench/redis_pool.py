"""Client CPU per Redis script call through redis-py's pools and the server's QuickPool.

`python -m bench.redis_pool` starts a fresh redis-server and times sequential EVALSHA
calls of a one-line script, with nothing to pack and with a 25-job enqueue call's keys
and arguments, through BlockingConnectionPool (what the server used before),
ConnectionPool, QuickPool (delayq_server/redis_client.py) with redis-py's packer and
write and with its own, and run_script (how the server sends its scripts), interleaved
in rounds under uvloop as the server runs. It prints the median over rounds of the
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
from delayq_server.redis_client import POOL_SIZE, QuickPool, run_script


class QuickPoolRedisPyWrite(QuickPool):
    """QuickPool with redis-py's own packer and write (a Task per command for its timeout), as
    before the quick write (redis_client.py, `_QuickWrite`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # QuickPool's connection class is a subclass of (_QuickWrite, the URL's class).
        self.connection_class = self.connection_class.__bases__[-1]


# name -> (pool class, whether the call goes through run_script instead of evalsha)
VARIANTS: dict[str, tuple[type[aioredis.ConnectionPool], bool]] = {
    "BlockingConnectionPool": (aioredis.BlockingConnectionPool, False),
    "ConnectionPool": (aioredis.ConnectionPool, False),
    "QuickPool, redis-py's packer and write": (QuickPoolRedisPyWrite, False),
    "QuickPool": (QuickPool, False),
    "QuickPool, run_script (the server's scripts)": (QuickPool, True),
}

# Script call shapes: (keys, args). "enqueue" is a 25-job enqueue call's (5 keys, a 4 kB
# jobs blob); "bare" a call with nothing to pack.
SHAPES: dict[str, tuple[list[str], list[Any]]] = {
    "bare": ([], []),
    "enqueue": (
        [f"dq:{{default/q/0}}:{k}" for k in ("idx", "ready", "stats", "exp", "rq:ab.1")],
        ["dq:{default/q/0}:", "", "1", 86_400_000, "dq:{default/q/0}:ch", 25, b"x" * 4000,
         1200, 0],
    ),
}  # fmt: skip


async def _calls(
    variant: tuple[type[aioredis.ConnectionPool], bool], shape: str, url: str, n: int
) -> tuple[float, float]:
    """(CPU us, wall us) per call over `n` sequential calls, after a warm-up."""
    pool_class, direct = variant
    keys, argv = SHAPES[shape]
    pool = pool_class.from_url(url, max_connections=POOL_SIZE, health_check_interval=30)
    client = aioredis.Redis.from_pool(pool)
    script = client.register_script("return 1")
    sha = await client.script_load("return 1")

    async def one() -> Any:
        if direct:
            return await run_script(client, script, keys, argv)
        return await client.evalsha(sha, len(keys), *keys, *argv)

    try:
        for _ in range(500):
            await one()
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(n):
            await one()
        return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6
    finally:
        await client.aclose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--calls", type=int, default=10_000, help="calls per variant per round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    figures: dict[tuple[str, str], list[tuple[float, float]]] = {
        (shape, name): [] for shape in SHAPES for name in VARIANTS
    }
    with tempfile.TemporaryDirectory() as tmp, ManagedRedis(Path(tmp), appendonly=False) as r:
        for _ in range(args.rounds):
            for shape, name in figures:
                figures[shape, name].append(
                    uvloop.run(_calls(VARIANTS[name], shape, r.url, args.calls))
                )
    print("| call shape | pool | client CPU us/call | wall us/call |")
    print("|---|---|---|---|")
    for (shape, name), runs in figures.items():
        cpu = statistics.median(c for c, _ in runs)
        wall = statistics.median(w for _, w in runs)
        print(f"| {shape} | {name} | {cpu:.1f} | {wall:.1f} |")


if __name__ == "__main__":
    main()
