"""The floor under `make bench-timers`: what a bare grpc.aio server costs for the same
events as delayq's timer path, with nothing of delayq in it (issue 12).

A delayq run at 1,000 due jobs/s is, seen from the server's process, a number of
stream messages per second (each after a timer wake-up and one or more script calls
to Redis) and a number of unary Ack calls per second (each with one script call).
`floor()` replays those rates against a bare server: a timer-paced server stream
that makes the same script calls per message (redis-py, EVALSHA of a script with
claim.lua's argument count and a reply of the delivered records' size) and writes a
message of delayq's average size, and a unary handler that makes one script call.
The server's CPU per second there is the cost of the events themselves with grpc.aio,
uvloop and redis-py on this machine; delayq's figure above it is what its own code
adds. Events are paced evenly, where delayq's follow random due times: an even pace
is the cheaper case, so the floor errs low.

Run alone: `python -m bench.timer_floor --messages 370 --scripts 450 --acks 100`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench import bare_server
from bench.harness.profiles import TICK, cpu_ticks

# A script with claim.lua's shape on the wire: 8 keys, 8 arguments, a reply of
# `reply` bytes (the delivered records). What Redis does inside does not matter here.
SCRIPT = "return string.rep('x', tonumber(ARGV[1]))"
SERVICE = "floor.Floor"


@dataclass(frozen=True, slots=True)
class Rates:
    messages: float  # stream messages per s
    scripts: float  # script calls per s on the stream path (claims, promotes)
    acks: float  # unary Ack calls per s (one script call each)
    message_bytes: int  # average stream message size
    ack_bytes: int  # average Ack request size
    reply_bytes: int  # average script reply size on the stream path


async def _serve(url: str, rates: Rates) -> None:
    import redis.asyncio as aredis

    rds = aredis.Redis.from_url(url)
    sha = await rds.script_load(SCRIPT)
    keys = [f"{{floor}}:k{i}" for i in range(8)]
    args = ["a", "b", "c", "d", "e", "f", "g"]
    msg = b"m" * rates.message_bytes
    per_msg = rates.scripts / rates.messages if rates.messages else 0.0

    async def stream(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
        period = 1 / rates.messages
        due = time.monotonic()
        owed = 0.0
        while True:
            due += period
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            owed += per_msg
            while owed >= 1:
                owed -= 1
                await rds.evalsha(sha, 8, *keys, rates.reply_bytes, *args)
            await context.write(msg)

    async def ack(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await rds.evalsha(sha, 8, *keys, 16, *args)
        return b"ok"

    await bare_server.serve(
        SERVICE,
        {
            "Stream": grpc.unary_stream_rpc_method_handler(stream),
            "Ack": grpc.unary_unary_rpc_method_handler(ack),
        },
    )


async def _drive(port: int, pid: int, rates: Rates, seconds: float) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = channel.unary_stream(f"/{SERVICE}/Stream", None, None)  # raw bytes
        ack = channel.unary_unary(f"/{SERVICE}/Ack", None, None)
        ack_body = b"t" * rates.ack_bytes

        async def read() -> None:
            async for _ in stream(b""):
                pass

        async def acker() -> None:
            due = time.monotonic()
            while True:
                due += 1 / rates.acks
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await ack(ack_body)

        tasks = [asyncio.create_task(read())]
        if rates.acks:
            tasks.append(asyncio.create_task(acker()))
        await asyncio.sleep(2)  # warm up: connections made, scripts loaded
        c0, t0 = cpu_ticks(pid), time.monotonic()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_ticks(pid), time.monotonic()
        for t in tasks:
            t.cancel()
        assert c0 is not None and c1 is not None
        return (c1 - c0) / TICK / (t1 - t0)


def floor(redis_url: str, rates: Rates, seconds: float = 10.0) -> float:
    """The bare server's CPU seconds per second at `rates` (see the module docstring)."""
    args = [
        sys.executable, "-m", "bench.timer_floor", "--serve", redis_url,
        "--messages", str(rates.messages), "--scripts", str(rates.scripts),
        "--acks", str(rates.acks), "--message-bytes", str(rates.message_bytes),
        "--ack-bytes", str(rates.ack_bytes), "--reply-bytes", str(rates.reply_bytes),
    ]  # fmt: skip
    with bare_server.spawned(args) as (port, pid):
        return asyncio.run(_drive(port, pid, rates, seconds))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--serve", default="", help=argparse.SUPPRESS)
    p.add_argument("--messages", type=float, default=370.0, help="stream messages per s")
    p.add_argument("--scripts", type=float, default=450.0, help="script calls per s (stream)")
    p.add_argument("--acks", type=float, default=100.0, help="Ack calls per s")
    p.add_argument("--message-bytes", type=int, default=800)
    p.add_argument("--ack-bytes", type=int, default=600)
    p.add_argument("--reply-bytes", type=int, default=600)
    p.add_argument("--seconds", type=float, default=10.0)
    a = p.parse_args()
    rates = Rates(a.messages, a.scripts, a.acks, a.message_bytes, a.ack_bytes, a.reply_bytes)
    if a.serve:
        import uvloop

        uvloop.run(_serve(a.serve, rates))
        return
    from tests.support.servers import ManagedRedis

    with (
        tempfile.TemporaryDirectory(prefix="delayq-floor-") as tmp,
        ManagedRedis(Path(tmp) / "redis", appendonly=False) as rds,
    ):
        cpu = floor(rds.url, rates, a.seconds)
    print(f"bare grpc.aio + redis-py at {rates}: server CPU {cpu:.3f} s per s")


if __name__ == "__main__":
    main()
