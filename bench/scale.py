"""`make bench-scale`: big backlogs and bursts on one Redis and on a 3-master cluster.

Drives the store (the same Lua scripts the server runs) directly for the backlog
and burst figures, and a real server for lateness:

* Redis bytes per delayed job (INFO used_memory delta / jobs), 100-byte payloads,
  due times spread over 30 days (--span-days, --payload-bytes);
* enqueue and promote cost per job with each backlog of --backlogs in place
  (default 10k and 1M; the issue's run: 10000,1000000,10000000): wall median of
  probes of 1,000 jobs, and CPU per job of the store code in this process plus
  every Redis node; the ratio of the largest backlog to the smallest, also with
  each figure divided by the same probe on an empty control Redis taken in turn
  with it (the machine's load moves a lot between a 10k and a 10M reading);
  and enqueue through a server (EnqueueBatch of 1,000 jobs of one delay): server
  plus Redis CPU per job, what an enqueue costs the system;
* lateness at --lateness-rate jobs/s due (client receive time - due time)
  through a server process, with the largest backlog in the same queue;
* a burst of --burst jobs due in the same second, promoted and claimed in
  bounded calls: commands over 5 ms (SLOWLOG) and the worst round trip of a
  PING loop in a separate process.

One setup at a time, each on a fresh Redis (or cluster) that is removed after:
10M jobs take several GiB. Prints a table; `--json` writes the figures. Figures
vary on a shared machine: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from bench.harness.delayq_runner import CHANNEL_OPTIONS
from bench.scale_burst import burst
from bench.scale_lateness import lateness
from bench.scale_probe import Cost, probe, probe_server, spec, used_memory
from delayq.v1 import service_pb2_grpc
from delayq_server import redis_client
from delayq_server.managed_redis import ManagedRedis
from delayq_server.store import ShardKeys, Store
from tests.support.servers import DelayqProcess

DAY_MS = 86_400_000
FILL_BATCH = 1000
NAMESPACE, QUEUE = "bench", "scale"
PAIRS = 3


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def _fill(
    store: Store,
    shards: list[ShardKeys],
    first: int,
    n: int,
    now: int,
    span_ms: int,
    payload: bytes,
) -> None:
    """n more jobs (numbered from ``first``) due at spread-out times in
    (now + 1 h, now + span), round robin over the shards."""
    sem = asyncio.Semaphore(8)
    step = 7_919_993  # spreads due times over the span without a random generator

    async def one(batch_no: int) -> None:
        async with sem:
            keys = shards[batch_no % len(shards)]
            base = first + batch_no * FILL_BATCH
            jobs = [
                spec(now + 3_600_000 + ((base + i) * step) % span_ms, payload)
                for i in range(FILL_BATCH)
            ]
            await store.enqueue(keys, jobs, now)

    tasks: set[asyncio.Task[None]] = set()
    for b in range(n // FILL_BATCH):  # bounded: never 10,000 tasks at once
        tasks.add(asyncio.create_task(one(b)))
        if len(tasks) >= 64:
            done, tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()
    if tasks:
        for t in (await asyncio.wait(tasks))[0]:
            t.result()


async def _probes(
    store: Store, control: Store, keys: ShardKeys, now: int, payload: bytes
) -> dict[str, Cost]:
    """PAIRS rounds that probe the backlog's Redis, then the empty control Redis,
    in turn: both see the same machine load, so backlog/control isolates what the
    backlog itself costs (the machine is shared and its load moves a lot)."""
    out: dict[str, list[Cost]] = {
        "enqueue": [],
        "promote": [],
        "ctl_enqueue": [],
        "ctl_promote": [],
    }
    for _ in range(PAIRS):
        for prefix, st in (("", store), ("ctl_", control)):
            enq, pro = await probe(st, keys, now, payload)
            out[prefix + "enqueue"].append(enq)
            out[prefix + "promote"].append(pro)
    return {k: Cost.mean(v) for k, v in out.items()}


async def _server_probe(url: str, store: Store, shards: list[ShardKeys], payload: bytes) -> Cost:
    """The enqueue probe through a server, started for it alone: its promoter would
    take the store-level probes' jobs (they fall due while they run)."""
    with DelayqProcess(url) as server:
        assert server.proc is not None
        async with grpc.aio.insecure_channel(server.address, options=CHANNEL_OPTIONS) as ch:
            stub = service_pb2_grpc.DelayQueueServiceStub(ch)
            return await probe_server(stub, server.proc.pid, store, shards, payload)


async def run(
    url: str, label: str, args: argparse.Namespace, ping_urls: Sequence[str], control_url: str
) -> dict[str, Any]:
    client = redis_client.connect(url)
    store = Store(client, default_shards=args.shards)
    await store.load_scripts()
    control = Store(redis_client.connect(control_url), default_shards=args.shards)
    await control.load_scripts()
    await control.shard_count(NAMESPACE, QUEUE, create=True)
    payload = os.urandom(args.payload_bytes // 2 + 1).hex().encode()[: args.payload_bytes]
    now = int(time.time() * 1000)
    await store.shard_count(NAMESPACE, QUEUE, create=True)  # the server sees all shards
    shards = [ShardKeys(NAMESPACE, QUEUE, s) for s in range(args.shards)]
    out: dict[str, Any] = {"setup": label, "rows": []}
    filled = 0
    base_mem = await used_memory(store)
    for target in args.backlogs:
        t0 = time.perf_counter()
        await _fill(store, shards, filled, target - filled, now, args.span_days * DAY_MS, payload)
        fill_s = time.perf_counter() - t0
        filled = target
        mem = await used_memory(store)
        costs = await _probes(store, control, shards[0], now, payload)
        costs["server_enqueue"] = await _server_probe(url, store, shards, payload)
        enq, pro, srv = costs["enqueue"], costs["promote"], costs["server_enqueue"]
        row: dict[str, Any] = {
            "backlog": filled,
            "bytes_per_job": (mem - base_mem) / filled,
            "used_memory": mem,
            "fill_s": fill_s,
            **{k: c.as_dict() for k, c in costs.items()},
            "load": _load(),
        }
        for op in ("enqueue", "promote"):  # backlog / empty control, same minute
            row[f"{op}_vs_control"] = {
                kind: row[op][kind] / row[f"ctl_{op}"][kind] for kind in ("wall_us", "cpu_us")
            }
        out["rows"].append(row)
        print(
            f"{label:>8} backlog {filled:>10,}: {row['bytes_per_job']:5.0f} B/job | enqueue "
            f"{enq.wall_us:5.1f} µs wall, {enq.cpu_us:5.1f} µs CPU ({enq.redis_cpu_us:4.1f} "
            f"Redis), x{row['enqueue_vs_control']['cpu_us']:.2f} control | promote "
            f"{pro.wall_us:5.1f} µs wall, {pro.cpu_us:5.1f} µs CPU ({pro.redis_cpu_us:4.1f} "
            f"Redis), x{row['promote_vs_control']['cpu_us']:.2f} control /job | through a "
            f"server: enqueue {srv.wall_us:5.1f} µs wall, {srv.cpu_us:5.1f} µs CPU (server "
            f"{srv.store_cpu_us:4.1f} + Redis {srv.redis_cpu_us:4.1f}) /job | fill "
            f"{fill_s:.0f} s | load {row['load']}",
            flush=True,
        )
    if args.lateness_seconds > 0:
        late = await lateness(
            url, store, NAMESPACE, QUEUE, args.lateness_rate, args.lateness_seconds, payload
        )
        late["backlog"], late["load"] = filled, _load()
        out["lateness"] = late
        print(
            f"{label:>8} lateness @{late['rate']:,.0f}/s due, {filled:,} backlog: p50 "
            f"{late['p50_ms']:.2f} ms, p99 {late['p99_ms']:.2f} ms, max {late['max_ms']:.1f} "
            f"ms, early {late['early']} of {late['jobs']:,} | load {late['load']}",
            flush=True,
        )
    if args.burst > 0:
        b = await burst(
            store, ShardKeys(NAMESPACE, "burst", 0), args.burst, now, payload, ping_urls
        )
        b["load"] = _load()
        out["burst"] = b
        print(
            f"{label:>8} burst of {args.burst:,} due at once: drained in {b['drain_s']:.1f} s, "
            f"{b['commands_over_5ms']} commands over 5 ms (slowest {b['slowest_command_ms']:.2f}"
            f" ms), PING worst {b['ping_worst_ms']:.1f} ms, p99 {b['ping_p99_ms']:.2f} ms, "
            f"{b['ping_over_20ms']} over 20 ms of {b['ping_pings']:,} | load {b['load']}",
            flush=True,
        )
        print(f"{label:>8}   every script call (EVALSHA): {b['script_calls']}", flush=True)
        for cmd, st in b["by_command"].items():
            print(
                f"{label:>8}   {cmd:>10}: {st['calls']:>7,} calls over 1 ms, max "
                f"{st['max_ms']:.2f} ms, {st['over_5ms']} over 5 ms",
                flush=True,
            )
    await client.aclose()
    await control.redis.aclose()
    return out


def _summary(res: dict[str, Any]) -> None:
    first, last = res["rows"][0], res["rows"][-1]
    if first is last:
        return
    ratios = {
        f"{op} {kind}": last[op][kind] / first[op][kind]
        for op in ("enqueue", "promote", "server_enqueue")
        for kind in ("wall_us", "cpu_us")
    }
    # The same ratio with each figure first divided by the control's of its minute.
    normalized = {
        f"{op} {kind}": last[f"{op}_vs_control"][kind] / first[f"{op}_vs_control"][kind]
        for op in ("enqueue", "promote")
        for kind in ("wall_us", "cpu_us")
    }
    res["ratios"], res["ratios_vs_control"] = ratios, normalized
    print(
        f"{res['setup']}: {last['backlog']:,} vs {first['backlog']:,} backlog (target <= 1.1x): "
        + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
        + "; against the control Redis of the same minute: "
        + ", ".join(f"{k} {v:.2f}x" for k, v in normalized.items())
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backlogs", default="10000,1000000", help="comma-separated sizes")
    parser.add_argument("--span-days", type=int, default=30)
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--shards", type=int, default=6, help="shards of the backlog queue")
    parser.add_argument("--lateness-rate", type=float, default=1000.0)
    parser.add_argument("--lateness-seconds", type=float, default=10.0, help="0: skip")
    parser.add_argument("--burst", type=int, default=200_000, help="jobs due at once; 0: skip")
    parser.add_argument("--setups", default="single,cluster", help="single, cluster or both")
    parser.add_argument("--cluster", action="store_true", help="(kept for old make targets)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.backlogs = [int(x) for x in args.backlogs.split(",")]
    setups = args.setups.split(",")
    results = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        ManagedRedis(Path(tmp) / "control", appendonly=False) as ctl,
    ):
        if "single" in setups:
            with ManagedRedis(Path(tmp) / "single", appendonly=False) as r:
                results.append(asyncio.run(run(r.url, "1 node", args, [r.url], ctl.url)))
        if "cluster" in setups:
            from tests.support.cluster import ManagedCluster

            with ManagedCluster(Path(tmp) / "cluster") as c:
                nodes = [f"redis://127.0.0.1:{n.port}" for n in c.nodes]
                results.append(asyncio.run(run(c.url, "cluster", args, nodes, ctl.url)))
    for res in results:
        _summary(res)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
