"""A local redis-server for `make run` and tests: AOF on, noeviction, own directory."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ManagedRedis:
    """Starts redis-server as a child process and stops it again.

    ``appendfsync`` picks the durability level (see README: "Durability").
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        *,
        appendonly: bool = True,
        appendfsync: str = "everysec",
        extra: list[str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra = extra or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError(
                "redis-server not found: install it (make system-deps / apt-get install "
                "redis-server) or set DELAYQ_REDIS_URL"
            )
        return [
            binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir.resolve()),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--daemonize", "no",
            "--protected-mode", "yes",
            *self.extra,
        ]  # fmt: skip

    def start(self, timeout: float = 10.0) -> ManagedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "redis.log", "ab") as log:  # the child keeps its own fd
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log_file = self.data_dir / "redis.log"
                raise RuntimeError(
                    f"redis-server exited with {self.proc.returncode}; see {log_file}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout}s")

    def stop(self, sig_kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            if sig_kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> ManagedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
