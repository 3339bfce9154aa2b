"""Where a unary Enqueue's time goes: bare grpc.aio echo servers beside the delayq server.

`python -m bench.unary_latency` starts a fresh redis-server, a delayq server, and two bare
grpc.aio servers (same server options and event loop as delayq): one answers at once, one
after one Redis round trip (EVALSHA of a one-line script, as enqueue's single script call).
It then times sequential calls (concurrency 1) from a grpc.aio client and from a blocking
grpc client against each, interleaved in rounds, and prints p50 per pair plus each
server's CPU per call (from /proc). The bare echo and the delayq server also run a second
time kept on one CPU (`--cpu-affinity auto`: every thread of the process on the first CPU
this one may use; server/delayq_server/cpu_affinity.py). Issue 12; docs/decisions.md has
the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc

from bench.harness.procs import REPO, stop
from bench.harness.profiles import cpu_ticks
from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

TICK = os.sysconf("SC_CLK_TCK")
METHOD = "/delayq.v1.DelayQueueService/Enqueue"
PINNED = ", --cpu-affinity auto"


def _ping_pong(cpus: tuple[int, int], n: int = 20_000) -> float:
    """µs per round trip of two threads waking each other through pipes, each kept on
    its CPU of `cpus`: what one hand-off between grpc's threads costs, twice."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()

    def echo() -> None:
        os.sched_setaffinity(0, {cpus[1]})  # 0: the calling thread
        for _ in range(n):
            os.read(r1, 1)
            os.write(w2, b"x")

    mask = os.sched_getaffinity(0)
    thread = threading.Thread(target=echo)
    thread.start()
    os.sched_setaffinity(0, {cpus[0]})
    try:
        start = time.perf_counter()
        for _ in range(n):
            os.write(w1, b"x")
            os.read(r2, 1)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        os.sched_setaffinity(0, mask)
        thread.join()
        for fd in (r1, w1, r2, w2):
            os.close(fd)


def _request() -> service_pb2.EnqueueRequest:
    req = service_pb2.EnqueueRequest(queue="bench", payload=b"x" * 100)
    req.delay.FromSeconds(3600)
    return req


async def _serve(kind: str, redis_url: str) -> None:
    """A bare server: Enqueue answers a fixed response, after one EVALSHA if kind is redis."""
    import redis.asyncio as aioredis

    from delayq_server.app import server_options
    from delayq_server.config import Config

    response = service_pb2.EnqueueResponse(job_id="0-abc")
    client = aioredis.Redis.from_url(redis_url)
    sha = await client.script_load("return 1")

    async def enqueue(request: Any, context: Any) -> service_pb2.EnqueueResponse:
        if kind == "redis":
            await client.evalsha(sha, 0)
        return response

    handler = grpc.method_handlers_generic_handler(
        "delayq.v1.DelayQueueService",
        {
            "Enqueue": grpc.unary_unary_rpc_method_handler(
                enqueue,
                request_deserializer=service_pb2.EnqueueRequest.FromString,
                response_serializer=service_pb2.EnqueueResponse.SerializeToString,
            )
        },
    )
    server = grpc.aio.server(options=server_options(Config()))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def _start(argv: list[str]) -> tuple[subprocess.Popen[str], int]:
    """A bare server child and the port it printed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        raise RuntimeError(f"{argv} exited before listening")
    return proc, int(line)


async def _aio_calls(port: int, n: int, options: list[tuple[str, Any]]) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        req = _request()
        for _ in range(20):  # warm the connection
            await stub.Enqueue(req)
        out = []
        for _ in range(n):
            t = time.perf_counter_ns()
            await stub.Enqueue(req)
            out.append((time.perf_counter_ns() - t) / 1e6)
        return out


def _sync_calls(port: int, n: int, options: list[tuple[str, Any]]) -> list[float]:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        req = _request()
        for _ in range(20):
            stub.Enqueue(req)
        out = []
        for _ in range(n):
            t = time.perf_counter_ns()
            stub.Enqueue(req)
            out.append((time.perf_counter_ns() - t) / 1e6)
        return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.unary_latency", description=__doc__)
    p.add_argument("--calls", type=int, default=1000, help="sequential calls per round and pair")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve", choices=["echo", "redis"], help=argparse.SUPPRESS)
    p.add_argument("--redis-url", help=argparse.SUPPRESS)
    p.add_argument("--cpu-affinity", default="off", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        import uvloop

        from delayq_server import cpu_affinity

        cpu_affinity.pin(args.cpu_affinity)
        uvloop.run(_serve(args.serve, args.redis_url))
        return

    from delayq._channel import channel_options

    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="unary-latency-")))
        redis = stack.enter_context(ManagedRedis(workdir / "redis", appendonly=False))
        servers: dict[str, tuple[int, int]] = {}  # name -> (pid, port)
        for kind, affinity in (("echo", "off"), ("echo", "auto"), ("redis", "off")):
            proc, port = _start(
                [
                    sys.executable,
                    "-m",
                    "bench.unary_latency",
                    "--serve",
                    kind,
                    "--redis-url",
                    redis.url,
                    "--cpu-affinity",
                    affinity,
                ]
            )
            stack.callback(stop, proc)
            servers[f"bare {kind}" + PINNED * (affinity == "auto")] = (proc.pid, port)
        for affinity in ("off", "auto"):
            delayq = stack.enter_context(
                DelayqProcess(redis.url, ["--log-level", "WARNING", "--cpu-affinity", affinity])
            )
            assert delayq.proc is not None
            servers["delayq" + PINNED * (affinity == "auto")] = (
                delayq.proc.pid,
                int(delayq.address.rsplit(":", 1)[1]),
            )
        clients: dict[str, Callable[[int], list[float]]] = {
            "aio": lambda port: asyncio.run(_aio_calls(port, args.calls, channel_options())),
            "sync": lambda port: _sync_calls(port, args.calls, channel_options()),
        }
        p50s: dict[tuple[str, str], list[float]] = {}
        cpu: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, (pid, port) in servers.items():
                for cname, run in clients.items():
                    before = cpu_ticks(pid) or 0
                    lat = run(port)
                    used = ((cpu_ticks(pid) or 0) - before) / TICK
                    p50s.setdefault((name, cname), []).append(statistics.median(lat))
                    cpu.setdefault(name, []).append(used / (args.calls + 20) * 1e6)
        allowed = sorted(os.sched_getaffinity(0))
        pairs = {"one CPU": (allowed[0], allowed[0])}
        if len(allowed) > 1:
            pairs["two CPUs"] = (allowed[0], allowed[1])
        for name, pair in pairs.items():
            rounds = [_ping_pong(pair) for _ in range(3)]
            print(f"thread ping-pong on {name}: {statistics.median(rounds):.1f} us per round trip")
        print("| server | client | p50 ms (median of rounds) | server CPU us/call |")
        print("|---|---|---|---|")
        for (name, cname), values in p50s.items():
            print(
                f"| {name} | {cname} | {statistics.median(values):.3f} | "
                f"{statistics.median(cpu[name]):.0f} |"
            )


if __name__ == "__main__":
    main()
