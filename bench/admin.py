"""`make bench-admin`: redrive and purge of 100,000 jobs through the real server (issue 14).

Fills a queue's dead-letter set with the store's own scripts (enqueue, claim,
reap past the lease with attempts exhausted), then times AdminService calls
the way the CLI makes them (steps of 10,000 until nothing is left):

* RedriveDeadLetters into the same queue (dead.lua, ids kept);
* PurgeQueue of the 100,000 jobs now ready;
* RedriveDeadLetters into another queue (new ids: enqueue there, then purge here);
* PurgeQueue of the dead state.

For each: jobs/s (wall time of the calls, client side), the slowest Redis
command while it ran (SLOWLOG over 1 ms; "< 1 ms" when none) and the mean Redis
time of its script calls (INFO commandstats). Both are wall time inside Redis:
on a loaded machine a script that loses its CPU mid-run shows longer, so the
load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from delayq.v1 import admin_pb2, admin_pb2_grpc, job_pb2
from delayq_server import redis_client
from delayq_server.ids import new_job_id
from delayq_server.managed_redis import ManagedRedis, free_port
from delayq_server.store import JobSpec, ShardKeys, Store

STEP = 10_000
SLOW_US = 1000  # SLOWLOG keeps commands over 1 ms


def _spec() -> JobSpec:
    return JobSpec(
        job_id=new_job_id(0, 1),
        payload=os.urandom(50).hex().encode(),  # 100 bytes
        headers={},
        delay_ms=0,
        due_at_ms=None,
        ttl_ms=0,
        max_attempts=1,
        backoff_initial_ms=1000,
        backoff_max_ms=60_000,
        multiplier=2.0,
        jitter=0.0,
        idempotency_key="",
    )


async def fill_dead(url: str, queue: str, n: int) -> None:
    """n dead jobs in `queue`: enqueued ready, claimed (their one attempt), reaped."""
    client = redis_client.connect(url)
    store = Store(client)
    await store.load_scripts()
    await store.shard_count("default", queue, create=True)
    keys = ShardKeys("default", queue, 0)
    for start in range(0, n, 1000):
        await store.enqueue(keys, [_spec() for _ in range(min(1000, n - start))])
    claimed = 0
    while claimed < n:
        claimed += len(await store.claim(keys, 500, 1000, "bench.1."))
    later = await store.time_ms() + 10_000  # past every lease
    while (await store.reap(keys, 200, now_ms=later)).more:
        pass
    await client.aclose()


def slowlog_reset(url: str) -> None:
    import redis

    r = redis.Redis.from_url(url)
    r.config_set("slowlog-log-slower-than", SLOW_US)
    r.config_set("slowlog-max-len", 100_000)
    r.slowlog_reset()
    r.config_resetstat()  # commandstats count from here
    r.close()


def redis_stats(url: str) -> dict[str, Any]:
    """The slowest command over SLOW_US since the reset (ms, name; 0 when none), and
    the mean Redis time of a script call (INFO commandstats, EVALSHA)."""
    import redis

    r = redis.Redis.from_url(url)
    entries: Any = r.slowlog_get(100_000)
    stats: Any = r.info("commandstats")
    r.config_set("slowlog-log-slower-than", 10_000)  # Redis' default again
    r.close()
    ev = stats.get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    out: dict[str, Any] = {
        "max_ms": 0.0,
        "command": "",
        "scripts": int(ev["calls"]),
        "script_mean_ms": int(ev["usec"]) / max(1, int(ev["calls"])) / 1000,
    }
    # Redis 7.0 also logs the commands a script runs (each shorter than its script).
    named = [(_name(e["command"]), float(e["duration"]) / 1000) for e in entries]
    named = [(n, d) for n, d in named if n not in ("SLOWLOG", "CONFIG", "INFO")]
    if named:
        name, worst = max(named, key=lambda x: x[1])
        out.update(max_ms=worst, command="EVALSHA (a script)" if name == "EVALSHA" else name)
    return out


def _name(cmd: Any) -> str:
    text = cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)
    return text.split(" ")[0].upper()


def timed(url: str, label: str, n: int, step: Callable[[], int]) -> dict[str, Any]:
    """Calls `step` (returns what is left) until 0; prints and returns the figures."""
    slowlog_reset(url)
    t0 = time.perf_counter()
    calls = 0
    while True:
        calls += 1
        if step() == 0:
            break
    elapsed = time.perf_counter() - t0
    slow = redis_stats(url)
    load = os.getloadavg()[0]
    worst = f"{slow['max_ms']:.2f} ms ({slow['command']})" if slow["max_ms"] else "< 1 ms"
    row = {
        "operation": label,
        "jobs": n,
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(n / elapsed),
        "rpc_calls": calls,
        "slowest_redis_ms": round(slow["max_ms"], 2),
        "slowest_command": slow["command"],
        "script_calls": slow["scripts"],
        "script_mean_ms": round(slow["script_mean_ms"], 3),
        "load_avg_1m": round(load, 1),
    }
    print(
        f"{label:<28} {n:>8,} jobs {elapsed:6.2f} s = {n / elapsed:>8,.0f} jobs/s | slowest "
        f"Redis command {worst}; {slow['scripts']} script calls, mean "
        f"{slow['script_mean_ms']:.3f} ms | load {load:.1f}",
        flush=True,
    )
    return row


def start_server(url: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq_server", "--redis-url", url, "--listen",
         f"127.0.0.1:{port}", "--log-level", "WARNING"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on" in line:
            return proc, f"127.0.0.1:{port}"
    raise RuntimeError("server did not start")


def run(n: int) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ManagedRedis(Path(tmp), appendonly=False) as r:
        proc, target = start_server(r.url)
        try:
            with grpc.insecure_channel(target) as ch:
                admin = admin_pb2_grpc.AdminServiceStub(ch)
                A = admin_pb2

                def redrive(target_queue: str = "") -> Callable[[], int]:
                    req = A.RedriveDeadLettersRequest(
                        queue="src", target_queue=target_queue, limit=STEP
                    )
                    return lambda: admin.RedriveDeadLetters(req, timeout=600).remaining

                def purge(queue: str, state: int) -> Callable[[], int]:
                    req = A.PurgeQueueRequest(queue=queue, state=state, limit=STEP)  # type: ignore[arg-type]
                    return lambda: admin.PurgeQueue(req, timeout=600).remaining

                asyncio.run(fill_dead(r.url, "src", n))
                admin.CreateQueue(A.CreateQueueRequest(queue="other"), timeout=10)
                rows.append(timed(r.url, "redrive, same queue", n, redrive()))
                rows.append(timed(r.url, "purge ready", n, purge("src", job_pb2.JOB_STATE_READY)))
                asyncio.run(fill_dead(r.url, "src", n))
                rows.append(timed(r.url, "redrive into another queue", n, redrive("other")))
                asyncio.run(fill_dead(r.url, "src", n))
                rows.append(timed(r.url, "purge dead", n, purge("src", job_pb2.JOB_STATE_DEAD)))
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = run(args.jobs)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
