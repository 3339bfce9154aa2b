"""Real processes for tests: redis-server and the delayq server, on free loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from delayq.v1 import service_pb2_grpc
from delayq_server.managed_redis import ManagedRedis, free_port

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "DelayqProcess", "ManagedRedis", "free_port"]


class DelayqProcess:
    """A `python -m delayq_server` child process; waits for its "listening" line."""

    def __init__(
        self,
        redis_url: str,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ):
        self.redis_url = redis_url
        self.args = list(args)
        self.env = env or {}
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0
        self.http_port = 0  # set when started with --http-listen
        self.output: list[str] = []
        self._reader: threading.Thread | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> DelayqProcess:
        listen = f"127.0.0.1:{self.port}" if self.port else "127.0.0.1:0"
        cmd = [
            sys.executable, "-m", "delayq_server",
            "--redis-url", self.redis_url, "--listen", listen, *self.args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        ready = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                if line.startswith("delayq: admin http on "):
                    self.http_port = int(line.rsplit(":", 1)[1])
                if line.startswith("delayq: listening on "):
                    self.port = int(line.rsplit(":", 1)[1])
                    ready.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not ready.wait(timeout):
            self.kill()
            raise RuntimeError("delayq server did not start:\n" + "".join(self.output))
        return self

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.address)

    def stub(self, channel: grpc.Channel) -> service_pb2_grpc.DelayQueueServiceStub:
        return service_pb2_grpc.DelayQueueServiceStub(channel)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        self._cleanup()
        return code

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._reader:
            self._reader.join(5)
        if self.proc and self.proc.stdout and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def __enter__(self) -> DelayqProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                self.terminate(15)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_until(predicate: object, timeout: float = 10.0, interval: float = 0.01) -> None:
    """Polls ``predicate()`` until it is true; fails the test after ``timeout``."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")
