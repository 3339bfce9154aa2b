"""A burst of jobs due in the same second, drained in bounded script calls while a
separate process PINGs Redis: the slowest commands (SLOWLOG, by script) and the
worst round trip a client saw.

Run alone as `python -m bench.scale_burst URL...` it is that PING process: one
PING every 5 ms to each URL in turn until SIGTERM, then one JSON line.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import redis

from bench.harness.stats import percentile
from bench.scale_probe import every_node, spec
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.store.store import CLAIM_LIMIT, PROMOTE_LIMIT

SLOW_US = 5_000  # the bound on one Redis command
# Commands over 1 ms are logged, so the slowest shows even under the bound; the
# distribution of every script call comes from INFO latencystats (EVALSHA).
LOG_US = 1_000
SPIKE_MS = 20.0  # the bound on a client-observed round trip
FILL_BATCH = 1000


def ping_main(urls: Sequence[str]) -> None:
    clients = [redis.Redis.from_url(u) for u in urls]
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    rtts: list[float] = []
    print("ready", flush=True)
    while not stop:
        for c in clients:
            t0 = time.perf_counter()
            c.ping()
            rtts.append((time.perf_counter() - t0) * 1000)
        time.sleep(0.005)
    rtts.sort()
    print(
        json.dumps(
            {
                "pings": len(rtts),
                "worst_ms": rtts[-1] if rtts else 0.0,
                "p99_ms": rtts[int(len(rtts) * 0.99)] if rtts else 0.0,
                "over_20ms": sum(1 for r in rtts if r > SPIKE_MS),
            }
        ),
        flush=True,
    )


class Pinger:
    """The PING loop in its own process, so this process' CPU cannot delay it."""

    def __init__(self, urls: Sequence[str]) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "bench.scale_burst", *urls],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        assert self._proc.stdout.readline().strip() == "ready"

    def stop(self) -> dict[str, Any]:
        self._proc.send_signal(signal.SIGTERM)
        out, _ = self._proc.communicate(timeout=30)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result


async def _evalsha_percentiles(store: Store) -> dict[str, float]:
    """p50/p99/p99.9 of every EVALSHA since the last CONFIG RESETSTAT (the worst node's)."""
    info: Any = await store.redis.info("latencystats", **every_node(store))
    nodes = info.values() if "latency_percentiles_usec_evalsha" not in info else [info]
    out: dict[str, float] = {}
    for node in nodes:
        raw = node.get("latency_percentiles_usec_evalsha", {})
        for k, v in raw.items() if isinstance(raw, dict) else []:
            out[f"{k}_ms"] = max(out.get(f"{k}_ms", 0.0), float(v) / 1000)
    return out


async def _slowlog(store: Store) -> list[dict[str, Any]]:
    entries: Any = await store.redis.slowlog_get(100_000, **every_node(store))
    if isinstance(entries, dict):  # cluster: per node
        entries = [e for node in entries.values() for e in node]
    return list(entries)


def _by_command(store: Store, entries: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Slow entries per script name (EVALSHA's sha) or command."""
    names = store.script_shas()
    out: dict[str, list[float]] = defaultdict(list)
    for e in entries:
        parts = e["command"].split()
        cmd = parts[0].decode().upper() if parts else "?"
        if cmd == "EVALSHA" and len(parts) > 1:
            cmd = names.get(parts[1].decode(), "EVALSHA ?")
        out[cmd].append(float(e["duration"]) / 1000)
    return {
        k: {
            "calls": len(v),
            "p50_ms": percentile(v, 50),
            "p99_ms": percentile(v, 99),
            "max_ms": max(v),
            "over_5ms": sum(1 for x in v if x > SLOW_US / 1000),
        }
        for k, v in sorted(out.items())
    }


async def burst(
    store: Store,
    keys: ShardKeys,
    n: int,
    now: int,
    payload: bytes,
    ping_urls: Sequence[str],
) -> dict[str, Any]:
    """n jobs due at one instant; promote, claim and ack in bounded calls until all are done."""
    due = now + 5_000
    for start in range(0, n, FILL_BATCH):
        jobs = [spec(due, payload) for _ in range(min(FILL_BATCH, n - start))]
        await store.enqueue(keys, jobs, now)
    nodes = every_node(store)
    await store.redis.config_set("slowlog-log-slower-than", LOG_US, **nodes)
    await store.redis.config_set("slowlog-max-len", 100_000, **nodes)
    await store.redis.slowlog_reset(**nodes)
    await store.redis.config_resetstat(**nodes)
    pinger = Pinger(ping_urls)
    t0 = time.perf_counter()
    moved = claimed = 0
    try:
        while moved < n or claimed < n:
            moved += (await store.promote(keys, PROMOTE_LIMIT, now_ms=due)).moved
            got = await store.claim(keys, CLAIM_LIMIT, 60_000, "bench.1.", now_ms=due)
            if got:
                await store.ack(keys, [LeaseRef(c.job_id, c.nonce) for c in got], now_ms=due)
            claimed += len(got)
    finally:
        drain_s = time.perf_counter() - t0
        pings = pinger.stop()
    scripts = await _evalsha_percentiles(store)
    logged = await _slowlog(store)
    slow = [e for e in logged if float(e["duration"]) > SLOW_US]
    return {
        "burst_jobs": n,
        "drain_s": drain_s,
        "promote_limit": PROMOTE_LIMIT,
        "claim_limit": CLAIM_LIMIT,
        "commands_over_5ms": len(slow),
        "slowest_command_ms": max((float(e["duration"]) for e in logged), default=0.0) / 1000,
        "script_calls": scripts,
        "by_command": _by_command(store, logged),
        **{f"ping_{k}": v for k, v in pings.items()},
    }


if __name__ == "__main__":
    ping_main(sys.argv[1:])
