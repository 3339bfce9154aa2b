"""`make bench-enqueue-ab`: this tree's enqueue.lua against another commit's, in one Redis.

Separate runs of `make bench-enqueue-calls` differ by 20-30% on this machine from one
minute to the next, more than most changes to the script. This tool fills one shard of a
fresh redis-server with `--backlog` jobs due over 30 days through the Store (as
bench/enqueue_calls.py does), loads both versions of enqueue.lua, and then stores
one-delay, rising and spread batches (`--shapes`) with the versions taking turns round
by round (`--rounds`, 4 batches of 1,000 per version, shape and round), so both meet
the same minutes and the same backlog. It prints, per shape and version, the median
Redis time per job (INFO commandstats), the script calls per batch, and the slowest
call of each round (INFO latencystats): median and p90 over the rounds.

Both versions are driven by this tree's Store, so the other commit's script must take
the same ARGV (a script written for fewer arguments ignores the extra ones; its events
MAXLEN is always the last). docs/decisions.md, 2026-11-26 ("one ZADD per due time")
used it against 77aeeba.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from bench.enqueue_calls import BATCH, SHAPES, _store_batches
from delayq_server import redis_client
from delayq_server.managed_redis import ManagedRedis
from delayq_server.store import ShardKeys, Store, scripts

ROOT = Path(__file__).resolve().parent.parent
LUA = "server/delayq_server/lua"
BATCHES = 4  # per version, shape and round


def source_at(rev: str) -> str:
    """enqueue.lua at `rev` with its includes inlined, as store/scripts.py does."""

    def read(relative: str) -> str:
        return subprocess.run(
            ["git", "show", f"{rev}:{LUA}/{relative}"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip

    return scripts.expand(read("enqueue.lua"), read)


async def run(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    payload = b"x" * args.payload_bytes
    shapes = [s.strip() for s in args.shapes.split(",")]
    with ManagedRedis(Path(tempfile.mkdtemp(prefix="delayq-enq-ab-")), appendonly=False) as rds:
        client = redis_client.connect(rds.url)
        store = Store(client, default_shards=1)
        await store.load_scripts()
        base = client.register_script(source_at(args.base))
        base.sha = await client.script_load(base.script)
        versions = {"this tree": store._scripts["enqueue"], args.base: base}
        keys = ShardKeys("bench", "ab", 0)
        fill = [SHAPES["spread"](rng) for _ in range(args.backlog // BATCH)]
        await _store_batches(store, keys, fill, payload)
        print(f"backlog of {args.backlog:,} jobs over 30 days; {args.rounds} rounds")
        await client.config_set("latency-tracking-info-percentiles", "50 99 100")
        got: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
        names = list(versions)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                store._scripts["enqueue"] = versions[name]
                for shape in shapes:
                    batches = [SHAPES[shape](rng) for _ in range(BATCHES)]
                    await client.config_resetstat()
                    await _store_batches(store, keys, batches, payload)
                    stats = (await client.info("commandstats"))["cmdstat_evalsha"]
                    pct = (await client.info("latencystats"))["latency_percentiles_usec_evalsha"]
                    got[shape, name].append(
                        (stats["usec"] / (BATCHES * BATCH), stats["calls"] / BATCHES, pct["p100"])
                    )
        for shape in shapes:
            for name in names:
                rows = got[shape, name]
                slowest = sorted(row[2] / 1000 for row in rows)
                print(
                    f"{shape:>9} {name:>12}: "
                    f"{statistics.median(row[0] for row in rows):5.2f} µs Redis per job, "
                    f"{statistics.median(row[1] for row in rows):4.1f} calls per batch, "
                    f"slowest call per round median {statistics.median(slowest):.2f} ms, "
                    f"p90 {slowest[int(len(slowest) * 0.9)]:.2f} ms"
                )
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="commit whose enqueue.lua to compare")
    parser.add_argument("--backlog", type=int, default=1_000_000, help="jobs in place first")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--shapes", default="one delay,in order,spread")
    parser.add_argument("--payload-bytes", type=int, default=100)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
