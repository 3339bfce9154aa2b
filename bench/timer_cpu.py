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
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import redis

from bench.harness.common import QUEUE, due_times_ms
from bench.harness.delayq_runner import CHANNEL_OPTIONS, Consumer, _request, enqueue_batched
from bench.harness.profiles import TICK, cpu_ticks, summarize
from bench.timer_floor import Rates, floor
from delayq import Delivery, Worker
from delayq.v1 import job_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

WORKER_CONCURRENCY = 100  # --consumer worker: enough slots that credit never limits


def _commands(url: str) -> dict[str, int]:
    client = redis.Redis.from_url(url)
    try:
        stats: dict[str, Any] = client.info("commandstats")
    finally:
        client.close()
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


class _CountingWorker(Worker):
    """The Python client's Worker, counting its Ack calls (what the server handles)."""

    ack_calls = 0

    async def _send_acks(self, batch: list[str]) -> None:
        self.ack_calls += 1
        await super()._send_acks(batch)


async def _run_worker(
    target: str, jobs: int, ack_linger_ms: float, on_due_ns: Callable[[int], None]
) -> int:
    """Consumes `jobs` deliveries with the Python Worker (an async handler that only
    notes its lateness); returns its Ack calls."""
    worker = _CountingWorker(
        target,
        concurrency=WORKER_CONCURRENCY,
        grace=timedelta(seconds=5),
        ack_linger=timedelta(milliseconds=ack_linger_ms),
    )
    seen = 0

    @worker.handler(QUEUE)
    async def handle(d: Delivery) -> None:
        nonlocal seen
        assert d.job.due_time is not None
        on_due_ns(int(d.job.due_time.timestamp() * 1_000_000) * 1000)
        seen += 1
        if seen >= jobs:
            worker.stop()

    await worker.serve()
    return worker.ack_calls


async def drive(target: str, args: argparse.Namespace) -> tuple[list[float], dict[str, int]]:
    """Lateness of every job, and what the server handled: stream messages and Ack
    calls, with their bytes (bench/timer_floor.py replays those rates). With
    `--consumer worker` the Python client's Worker consumes instead of the
    benchmark's stream reader; its stream messages are not counted."""
    ack = not args.no_ack
    jobs = int(args.rate * args.seconds)
    due_ms = due_times_ms(args.lead, jobs, args.rate)
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
        if args.consumer == "worker":

            def on_due_ns(due_ns: int) -> None:
                lateness.append((time.time_ns() - due_ns) / 1e6)

            consumer.ack_calls = await _run_worker(target, jobs, args.ack_linger_ms, on_due_ns)
        elif ack:
            await consumer.run(on_delivery, jobs)
        else:
            call = stub.Consume(consumer.request)
            async for resp in call:
                for delivery in resp.deliveries:
                    on_delivery(delivery)
                consumer.count(resp)
                if len(lateness) >= jobs:
                    break
            call.cancel()
    handled = {
        "messages": consumer.messages,
        "message_bytes": consumer.message_bytes,
        "ack_calls": consumer.ack_calls,
        "ack_bytes": consumer.ack_bytes,
    }
    return lateness, handled


def _spy(pid: int, out: str) -> subprocess.Popen[bytes]:
    # BENCH_NATIVE=1: C frames too (gRPC core, uvloop); py-spy then has to pause the process.
    native = ["--native"] if os.environ.get("BENCH_NATIVE") else ["--nonblocking"]
    # BENCH_GIL=1: only the thread holding the GIL (py-spy counts a thread the kernel
    # descheduled inside a syscall as busy, e.g. a socket write that woke Redis).
    gil = ["--gil"] if os.environ.get("BENCH_GIL") else []
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
         "--rate", "250", *native, *gil, "--format", "raw", "--output", out],
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

        async def run() -> tuple[list[float], dict[str, int]]:
            task = asyncio.create_task(drive(server.address, args))
            # The window opens `lead` s after the due times were drawn: sample
            # CPU and Redis calls from then until the last job arrived.
            await asyncio.sleep(args.lead)
            marks["cpu0"], marks["cmd0"] = cpu_ticks(pid), _commands(rds.url)
            marks["t0"] = time.monotonic()
            spy = await asyncio.to_thread(_spy, pid, args.profile) if args.profile else None
            out = await task
            if spy is not None:
                await asyncio.to_thread(_spy_done, spy, args.profile)
            marks["cpu1"], marks["cmd1"] = cpu_ticks(pid), _commands(rds.url)
            marks["t1"] = time.monotonic()
            return out

        lateness, handled = asyncio.run(run())
        window_s = marks["t1"] - marks["t0"]
        scripts = marks["cmd1"].get("evalsha", 0) - marks["cmd0"].get("evalsha", 0)
        msgs = max(1, handled["messages"])
        rates = Rates(
            messages=handled["messages"] / window_s,
            scripts=max(0, scripts - handled["ack_calls"]) / window_s,
            acks=handled["ack_calls"] / window_s,
            message_bytes=handled["message_bytes"] // msgs,
            ack_bytes=handled["ack_bytes"] // max(1, handled["ack_calls"]),
            reply_bytes=handled["message_bytes"] // msgs,
        )
        # The same events against a bare grpc.aio server, on the same Redis.
        floor_cpu_s = floor(rds.url, rates) if args.floor and handled["messages"] else None
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
        "rates": asdict(rates),
        # CPU s per s of the bare server, as s per 1,000 jobs at this run's rate
        "floor_cpu_s_per_1k": floor_cpu_s / (jobs / window_s) * 1000 if floor_cpu_s else None,
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
    parser.add_argument(
        "--consumer",
        choices=("stream", "worker"),
        default="stream",
        help="stream: the benchmark's reader (acks gathered 10 ms); worker: the Python "
        f"client's Worker (async handler, concurrency {WORKER_CONCURRENCY})",
    )
    parser.add_argument(
        "--ack-linger-ms",
        type=float,
        default=10.0,
        help="--consumer worker: the Worker's ack_linger (0: each ack at once)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also replay the run's stream messages, script calls and Ack calls per s "
        "against a bare grpc.aio server (bench/timer_floor.py) and print its CPU",
    )
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
    rt = r["rates"]
    print(
        f"server handled per s: {rt['messages']:.0f} stream messages of {rt['message_bytes']} B, "
        f"{rt['scripts']:.0f} script calls besides acks, {rt['acks']:.0f} Ack calls"
    )
    if r["floor_cpu_s_per_1k"] is not None:
        print(
            f"floor (bare grpc.aio + redis-py, same events per s): "
            f"{r['floor_cpu_s_per_1k']:.3f} s per 1,000 jobs; delayq "
            f"{r['server_cpu_s_per_1k'] / r['floor_cpu_s_per_1k']:.2f}x the floor"
        )


if __name__ == "__main__":
    main()
