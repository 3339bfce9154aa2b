"""`make bench-memory`: where Redis' bytes per delayed job go, per key kind (issue 12).

Stores `--jobs` delayed jobs (100-byte payload, default settings, EnqueueBatch of 1000) the
way the benchmark's memory rows do, due at random over 1 h (dense) and 30 days (sparse)
after one minute, each on a fresh redis-server and server; prints used_memory per job and,
per kind of key (records, buckets, index, ...), the key count, MEMORY USAGE bytes per job
and the encodings seen.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.harness.delayq_runner import CHANNEL_OPTIONS, _request, delays, enqueue_batched
from delayq.v1 import service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

SPREADS = {"dense": 3600.0, "sparse": 30 * 86400.0}
# Key kinds: the part after the shard prefix, numbers and ids folded.
_PREFIX = re.compile(r"^dq:\{[^}]*\}:")


def kind(key: str) -> str:
    rest = _PREFIX.sub("", key)
    if rest == key:
        return "global: " + re.sub(r":[^:]+$", ":*", key)
    head = rest.split(":", 1)[0]
    return head + (":*" if ":" in rest else "")


def breakdown(url: str, jobs: int) -> dict[str, dict[str, Any]]:
    client = redis.Redis.from_url(url)
    out: dict[str, dict[str, Any]] = collections.defaultdict(
        lambda: {"keys": 0, "bytes": 0, "encodings": collections.Counter()}
    )
    try:
        for key in client.scan_iter(count=1000):
            name = key.decode()
            encoding = client.object("encoding", key)
            if encoding is None:
                continue  # expired since the scan saw it (lost-reply entries live 30 s)
            row = out[kind(name)]
            row["keys"] += 1
            row["bytes"] += int(client.memory_usage(key, samples=0) or 0)
            row["encodings"][encoding.decode()] += 1
    finally:
        client.close()
    return {
        k: {
            "keys": v["keys"],
            "bytes_per_job": round(v["bytes"] / jobs, 1),
            "encodings": dict(v["encodings"]),
        }
        for k, v in sorted(out.items(), key=lambda kv: -int(kv[1]["bytes"]))
    }


async def fill(target: str, jobs: int, spread_s: float) -> None:
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        requests = [_request(delay_s=d) for d in delays({"jobs": jobs, "spread_s": spread_s})]
        await enqueue_batched(stub, requests, batch_size=1000, concurrency=2)


def measure(
    jobs: int, spread: str, server_args: list[str], redis_args: list[str]
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="delayq-mem-") as tmp,
        ManagedRedis(Path(tmp) / "redis", appendonly=False, extra=redis_args) as rds,
        DelayqProcess(rds.url, server_args) as server,
    ):
        client = redis.Redis.from_url(rds.url)
        before = int(client.info("memory")["used_memory"])
        asyncio.run(fill(server.address, jobs, SPREADS[spread]))
        after = int(client.info("memory")["used_memory"])
        client.close()
        return {
            "spread": spread,
            "jobs": jobs,
            "used_memory_per_job": round((after - before) / jobs, 1),
            "keys": breakdown(rds.url, jobs),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--spreads", default="dense,sparse")
    parser.add_argument("--server-args", default="", help="extra delayq server flags")
    parser.add_argument("--redis-args", default="", help="extra redis-server flags")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [
        measure(args.jobs, s, args.server_args.split(), args.redis_args.split())
        for s in args.spreads.split(",")
    ]
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        return
    for r in results:
        print(f"{r['spread']}: {r['jobs']:,} jobs, used_memory {r['used_memory_per_job']} B/job")
        print(f"  {'key kind':<24}{'keys':>10}{'B/job':>10}  encodings")
        for name, row in r["keys"].items():
            print(f"  {name:<24}{row['keys']:>10,}{row['bytes_per_job']:>10}  {row['encodings']}")


if __name__ == "__main__":
    main()
