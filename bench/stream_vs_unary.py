"""What a unary call costs against a message on an open stream, with nothing of delayq
in either (issue 12: why the AsyncClient sends its batches on EnqueueStream).

A bare grpc.aio server (uvloop, the iomgr listener as delayq's) answers each request,
after one Redis script call, either as a unary call (`U`) or as a message on one
bidirectional stream (`B`); a closed-loop client keeps `--in-flight` requests out.
Printed per mode: requests per second and the CPU per request of the server process
and of the client process, from /proc. Request and answer sizes are those of a
25-job EnqueueBatch. Run: `python -m bench.stream_vs_unary --rounds 2`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_EXPERIMENTS", "-event_engine_listener")  # as delayq_server

import grpc

from bench import bare_server
from bench.harness.profiles import TICK, cpu_ticks

SERVICE = "floor.StreamVsUnary"
REQUEST = b"r" * 3800  # a 25-job EnqueueBatchRequest
ANSWER = b"a" * 1000  # its response


async def _serve(url: str) -> None:
    import redis.asyncio as aredis

    rds = aredis.Redis.from_url(url)
    sha = await rds.script_load("return string.rep('x', 1000)")

    async def unary(request: bytes, context: Any) -> bytes:
        await rds.evalsha(sha, 1, "{k}", request)
        return ANSWER

    async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        answers: asyncio.Queue[bytes] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def one(request: bytes) -> None:
            await rds.evalsha(sha, 1, "{k}", request)
            answers.put_nowait(ANSWER)

        async def read() -> None:
            async for request in requests:
                task = asyncio.create_task(one(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        reader = asyncio.create_task(read())
        try:
            while True:
                yield await answers.get()
        finally:
            reader.cancel()

    await bare_server.serve(
        SERVICE,
        {
            "U": grpc.unary_unary_rpc_method_handler(unary),
            "B": grpc.stream_stream_rpc_method_handler(stream),
        },
    )


async def _drive(port: int, pid: int, mode: str, seconds: float, in_flight: int) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        done = 0
        tasks: list[asyncio.Task[None]] = []
        if mode == "U":
            call = channel.unary_unary(f"/{SERVICE}/U", None, None)  # raw bytes

            async def loop() -> None:
                nonlocal done
                while True:
                    await call(REQUEST)
                    done += 1

            tasks = [asyncio.create_task(loop()) for _ in range(in_flight)]
        else:
            open_stream: Any = channel.stream_stream(f"/{SERVICE}/B", None, None)
            stream = open_stream()
            for _ in range(in_flight):
                await stream.write(REQUEST)

            async def echo() -> None:
                nonlocal done
                while True:
                    await stream.read()
                    done += 1
                    await stream.write(REQUEST)

            tasks = [asyncio.create_task(echo())]
        await asyncio.sleep(2)  # warm up
        s0, c0, n0, t0 = cpu_ticks(pid), cpu_ticks(os.getpid()), done, time.monotonic()
        await asyncio.sleep(seconds)
        s1, c1, n1, t1 = cpu_ticks(pid), cpu_ticks(os.getpid()), done, time.monotonic()
        for t in tasks:
            t.cancel()
        assert None not in (s0, s1, c0, c1)
        n = n1 - n0
        server_us = 1e6 * (s1 - s0) / TICK / n  # type: ignore[operator]
        client_us = 1e6 * (c1 - c0) / TICK / n  # type: ignore[operator]
        name = "unary calls" if mode == "U" else "stream messages"
        return (
            f"{name:16} {n / (t1 - t0):7.0f}/s  server {server_us:6.1f} µs  "
            f"client {client_us:6.1f} µs per request ({in_flight} in flight)"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--serve", default="", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--in-flight", type=int, default=2)
    a = p.parse_args()
    import uvloop

    if a.serve:
        uvloop.run(_serve(a.serve))
        return
    from tests.support.servers import ManagedRedis

    with (
        tempfile.TemporaryDirectory(prefix="delayq-svu-") as tmp,
        ManagedRedis(Path(tmp) / "redis", appendonly=False) as rds,
    ):
        for _ in range(a.rounds):
            for mode in ("U", "B"):
                args = [sys.executable, "-m", "bench.stream_vs_unary", "--serve", rds.url]
                with bare_server.spawned(args) as (port, pid):
                    line = uvloop.run(_drive(port, pid, mode, a.seconds, a.in_flight))
                print(line, flush=True)


if __name__ == "__main__":
    main()
