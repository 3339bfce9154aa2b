"""Unary Enqueue calls/s with `--workers 1` and `--workers 2` (`make bench-workers`, issue 12),
each also with `--cpu-affinity auto` (every server process kept on a CPU of its own).

One grpc.aio client keeps `--concurrency` unary Enqueue calls in flight, spread over
`--channels` channels that each open their own connection (the kernel hands each new
connection to one worker: SO_REUSEPORT balances connections, not calls). Every
setting gets a fresh redis-server and server per round, the settings taking turns
(the machine's speed moves with the hour). Prints calls/s and the CPU per call of the
server's processes (all workers) and of the client, medians of the rounds.

On a 2-core machine the client and Redis share the cores with the workers, so this
shows how far a second process helps here, not how far it helps on a bigger host.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.harness.delayq_runner import _request
from bench.harness.profiles import TICK, cpu_ticks
from delayq.v1 import service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

# (workers, client channels, --cpu-affinity)
SETTINGS = [(1, 4, "off"), (2, 4, "off"), (2, 1, "off"), (1, 4, "auto"), (2, 4, "auto")]


def _server_ticks(supervisor: int) -> int:
    """CPU ticks of the server's processes: the supervisor's children (the workers),
    or the server itself when it runs alone."""
    try:
        children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    except OSError:
        children = []
    pids = [int(p) for p in children] or [supervisor]
    return sum(cpu_ticks(pid) or 0 for pid in pids)


async def _load(address: str, channels: int, concurrency: int, calls: int) -> float:
    """Seconds for `calls` unary Enqueues, `concurrency` in flight over `channels`."""
    chans = [
        grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(channels)
    ]
    stubs = [service_pb2_grpc.DelayQueueServiceStub(ch) for ch in chans]
    for ch in chans:
        await ch.channel_ready()
    left = calls
    req = _request(delay_s=3600)

    async def caller(stub: Any) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await stub.Enqueue(req)

    started = time.perf_counter()
    await asyncio.gather(*(caller(stubs[i % channels]) for i in range(concurrency)))
    seconds = time.perf_counter() - started
    for ch in chans:
        await ch.close(None)
    return seconds


def one_round(
    workers: int, channels: int, affinity: str, args: argparse.Namespace
) -> dict[str, float]:
    flags = ["--workers", str(workers), "--cpu-affinity", affinity]
    with (
        tempfile.TemporaryDirectory(prefix="delayq-workers-") as tmp,
        ManagedRedis(Path(tmp), appendonly=False) as rds,
        DelayqProcess(rds.url, flags) as server,
    ):
        assert server.proc is not None
        asyncio.run(_load(server.address, channels, args.concurrency, args.calls // 10))  # warm
        s0, c0 = _server_ticks(server.proc.pid), time.process_time()
        seconds = asyncio.run(_load(server.address, channels, args.concurrency, args.calls))
        s1, c1 = _server_ticks(server.proc.pid), time.process_time()
    return {
        "rate": args.calls / seconds,
        "server_us": (s1 - s0) / TICK / args.calls * 1e6,
        "client_us": (c1 - c0) / args.calls * 1e6,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.workers_scaling", description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=10_000, help="measured calls per round")
    p.add_argument("--concurrency", type=int, default=50, help="calls in flight")
    args = p.parse_args()
    runs: dict[tuple[int, int, str], list[dict[str, float]]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        k = r % len(SETTINGS)
        for workers, channels, affinity in SETTINGS[k:] + SETTINGS[:k]:
            res = one_round(workers, channels, affinity, args)
            runs[workers, channels, affinity].append(res)
            print(
                f"round {r + 1}: --workers {workers} --cpu-affinity {affinity}, "
                f"{channels} channel(s): "
                f"{res['rate']:,.0f} calls/s, server {res['server_us']:.0f} µs/call, "
                f"client {res['client_us']:.0f} µs/call",
                flush=True,
            )
    print(f"\nunary Enqueue, {args.concurrency} in flight, medians of {args.rounds} rounds")
    print(
        "| server processes | --cpu-affinity | client channels | calls/s | server CPU µs/call "
        "| client CPU µs/call |"
    )
    print("|---|---|---|---|---|---|")
    for (workers, channels, affinity), rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(
            f"| {workers} | {affinity} | {channels} | {med['rate']:,.0f} | "
            f"{med['server_us']:.0f} | "
            f"{med['client_us']:.0f} |"
        )


if __name__ == "__main__":
    main()
