"""A bare grpc.aio server in a child process, for the floors delayq is measured against
(bench/timer_floor.py, bench/stream_vs_unary.py): nothing of delayq in it."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from typing import Any

import grpc


async def serve(service: str, handlers: dict[str, Any]) -> None:
    """Serves `handlers` (method name -> grpc method handler) on a free loopback port,
    prints the port for `spawned` and runs until killed."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def spawned(args: Sequence[str]) -> Iterator[tuple[int, int]]:
    """Runs `args` (a process whose first line of output is its port, as `serve`
    prints it) and yields (port, pid); kills it on exit."""
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc.pid
    finally:
        proc.kill()
        proc.wait()
