"""`make bench-timers`: the server's CPU per 1,000 due jobs at a steady rate, and lateness.

Stores `--rate` x `--seconds` jobs (100-byte payload) due at random whole ms over the
window, all before the window opens, then one Consume stream receives them and acks in
batches (one Ack call in flight, as the benchmark's delayq runner does). Prints the
delayq server's CPU seconds (utime + stime from /proc) spent inside the due window only,
per 1,000 jobs, beside the consumer-measured lateness (receive time - requested due
time): p50, p99, max and early deliveries; and Redis calls per job (INFO commandstats).
`--no-ack` leaves the jobs leased, to see what acks cost (issue 12).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.harness.common import due_times_ms
from bench.harness.delayq_runner import CHANNEL_OPTIONS, Consumer, _request, enqueue_batched
from bench.harness.profiles import TICK, cpu_ticks, summarize
from delayq.v1 import job_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis


def _commands(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


async def drive(target: str, rate: float, seconds: float, lead_s: float, ack: bool) -> list[float]:
    jobs = int(rate * seconds)
    due_ms = due_times_ms(lead_s, jobs, rate)
    lateness: list[float] = []
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        consumer = Consumer(
            stub, max_outstanding=min(jobs, 10_000) if not ack else 1000, max_batch=100
        )
        if not ack:
            consumer.wake = asyncio.Event()  # the acker never runs: nothing wakes it

        def on_delivery(d: job_pb2.Delivery) -> None:
            lateness.append((time.time_ns() - d.job.due_time.ToNanoseconds()) / 1e6)

        await enqueue_batched(
            stub,
            [_request(due_ns=d * 1_000_000) for d in due_ms],
            batch_size=1000,
            concurrency=2,
        )
        if time.time() * 1000 > due_ms[0]:
            raise SystemExit("enqueueing took longer than the lead: raise --lead")
        if ack:
            await consumer.run(on_delivery, jobs)
        else:
            call = stub.Consume(consumer.request)
            async for resp in call:
                for delivery in resp.deliveries:
                    on_delivery(delivery)
                if len(lateness) >= jobs:
                    break
            call.cancel()
    return lateness


def _spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    # BENCH_NATIVE=1: C frames too (gRPC core, uvloop); py-spy then has to pause the process.
    native = ["--native"] if os.environ.get("BENCH_NATIVE") else ["--nonblocking"]
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
         "--rate", "250", *native, "--format", "raw", "--output", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _spy_done(spy: subprocess.Popen[bytes], out: str) -> None:
    spy.send_signal(signal.SIGINT)
    spy.wait(30)
    Path(out + ".top").write_text(summarize(Path(out)))


def measure(args: argparse.Namespace, server_tree: str = "") -> dict[str, Any]:
    """One run on a fresh Redis and server (``server_tree``: another checkout's server)."""
    env = {"PYTHONPATH": str(Path(server_tree) / "server")} if server_tree else None
    jobs = int(args.rate * args.seconds)
    with (
        tempfile.TemporaryDirectory(prefix="delayq-timers-") as tmp,
        ManagedRedis(Path(tmp) / "redis", appendonly=False) as rds,
        DelayqProcess(rds.url, args.server_args.split(), env=env) as server,
    ):
        assert server.proc is not None
        pid = server.proc.pid
        marks: dict[str, Any] = {}

        async def run() -> list[float]:
            task = asyncio.create_task(
                drive(server.address, args.rate, args.seconds, args.lead, not args.no_ack)
            )
            # The window opens `lead` s after the due times were drawn: sample
            # CPU and Redis calls from then until the last job arrived.
            await asyncio.sleep(args.lead)
            marks["cpu0"], marks["cmd0"] = cpu_ticks(pid), _commands(rds.url)
            spy = await asyncio.to_thread(_spy, pid, args.profile) if args.profile else None
            out = await task
            if spy is not None:
                await asyncio.to_thread(_spy_done, spy, args.profile)
            marks["cpu1"], marks["cmd1"] = cpu_ticks(pid), _commands(rds.url)
            return out

        lateness = asyncio.run(run())
    cpu_s = (marks["cpu1"] - marks["cpu0"]) / TICK
    calls = {
        k: (v - marks["cmd0"].get(k, 0)) / jobs
        for k, v in marks["cmd1"].items()
        if v - marks["cmd0"].get(k, 0) > 0 and k not in ("info",)
    }
    q = statistics.quantiles(lateness, n=100)
    return {
        "jobs": jobs,
        "received": len(lateness),
        "server_cpu_s": cpu_s,
        "server_cpu_s_per_1k": cpu_s / jobs * 1000,
        "lateness_p50_ms": statistics.median(lateness),
        "lateness_p99_ms": q[98],
        "lateness_max_ms": max(lateness),
        "early": sum(1 for x in lateness if x < 0),
        "redis_calls_per_job": {k: round(v, 3) for k, v in sorted(calls.items())},
        "acks": not args.no_ack,
        "worst": sorted(lateness, reverse=True)[:5],
        "late_runs": _late_runs(lateness),
    }


def _late_runs(lateness: list[float], over_ms: float = 5.0) -> int:
    """How many separate episodes (in due order) delivered jobs over `over_ms` late."""
    runs, inside = 0, False
    for x in lateness:
        if x > over_ms and not inside:
            runs += 1
        inside = x > over_ms
    return runs


def compare(args: argparse.Namespace) -> None:
    """Interleaved A/B (this tree, then --compare, alternating who goes first): on a
    shared machine only figures from the same minutes compare."""
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
    for i in range(args.rounds):
        order = [("this", ""), ("other", args.compare)]
        for name, tree in order if i % 2 == 0 else order[::-1]:
            r = measure(args, tree)
            runs[name].append(r)
            print(
                f"round {i + 1} {name}: {r['server_cpu_s_per_1k']:.3f} s/1k, "
                f"p99 {r['lateness_p99_ms']:.2f} ms, early {r['early']}",
                flush=True,
            )
    for name, rs in runs.items():
        cpu = statistics.median(r["server_cpu_s_per_1k"] for r in rs)
        p99 = statistics.median(r["lateness_p99_ms"] for r in rs)
        p50 = statistics.median(r["lateness_p50_ms"] for r in rs)
        early = sum(r["early"] for r in rs)
        print(
            f"{name} ({args.compare if name == 'other' else 'this tree'}): median of "
            f"{len(rs)}: {cpu:.3f} s CPU per 1,000 jobs, lateness p50 {p50:.2f} ms, "
            f"p99 {p99:.2f} ms, early {early}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=1000.0, help="jobs falling due per s")
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the due window")
    parser.add_argument("--lead", type=float, default=15.0, help="s from drawing to the window")
    parser.add_argument("--no-ack", action="store_true", help="leave deliveries unacked")
    parser.add_argument("--server-args", default="", help="extra delayq server flags")
    parser.add_argument("--profile", default="", help="py-spy the server into this file (.top)")
    parser.add_argument(
        "--compare",
        default="",
        help="another checkout (e.g. a worktree of main): its server and this one take turns",
    )
    parser.add_argument("--rounds", type=int, default=3, help="turns each with --compare")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.compare:
        compare(args)
        return
    r = measure(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    print(
        f"{r['jobs']:,} jobs at {args.rate:,.0f}/s due{'' if r['acks'] else ' (no acks)'}: "
        f"server CPU {r['server_cpu_s']:.2f} s = {r['server_cpu_s_per_1k']:.3f} s per 1,000 jobs; "
        f"lateness p50 {r['lateness_p50_ms']:.2f} ms, p99 {r['lateness_p99_ms']:.2f} ms, "
        f"max {r['lateness_max_ms']:.1f} ms, early {r['early']}"
    )
    print(f"Redis calls per job: {r['redis_calls_per_job']}")
    print(f"worst: {r['worst']}, episodes over 5 ms: {r['late_runs']}")


if __name__ == "__main__":
    main()
