"""A local redis-server for `make run` and tests: AOF on, noeviction, own directory."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

LOCK_FILE = "delayq.lock"
_PR_SET_PDEATHSIG = 1
# Loaded before any fork: the child only calls into it (no dlopen after fork).
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


class DataDirInUse(RuntimeError):
    """Another managed redis-server already uses this data directory."""


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: the kernel sends the child SIGTERM when its parent dies, even
    by SIGKILL, so a killed server never leaves its redis-server behind."""

    def setup() -> None:
        if _LIBC is not None:
            _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup


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
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.extra = extra or []
        self.env = env  # None: inherit ours (tests set LD_PRELOAD here)
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None

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
            # Job records (~150 B with a 100 B payload) stay in compact
            # listpack-encoded groups of ~100 (docs/decisions.md, "Memory layout v2").
            "--hash-max-listpack-value", "256",
            "--hash-max-listpack-entries", "128",
            "--daemonize", "no",
            "--protected-mode", "yes",
            *self.extra,
        ]  # fmt: skip

    def _take_lock(self) -> None:
        """Locks the data directory (held until stop): two redis-servers appending
        to one AOF would corrupt it. The kernel drops the lock if we die."""
        path = self.data_dir / LOCK_FILE
        lock = open(path, "a+")  # noqa: SIM115 - held open until stop()
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            lock.close()
            raise DataDirInUse(
                f"data directory {self.data_dir.resolve()} is in use by another delayq "
                f"managed redis-server (pid {holder}; lock {path})"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        self._lock = lock

    def _release_lock(self) -> None:
        if self._lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def start(self, timeout: float = 10.0) -> ManagedRedis:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        try:
            return self._start(timeout)
        except BaseException:
            self._release_lock()
            raise

    def _start(self, timeout: float) -> ManagedRedis:
        with open(self.data_dir / "redis.log", "ab") as log:  # the child keeps its own fd
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
                preexec_fn=_die_with_parent(os.getpid()),  # started before any thread
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
        self._release_lock()

    def __enter__(self) -> ManagedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
