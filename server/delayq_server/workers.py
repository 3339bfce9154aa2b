"""`--workers N`: N server processes sharing one port, supervised by this one.

grpc.aio serves about 2-3k unary calls/s per process, so unary RPCs scale with
cores only across processes. The children bind the same port with
SO_REUSEPORT, which the kernel load-balances. That is exactly what made two
separate `make run`s split traffic silently (issue 8), so the group is guarded:
the supervisor first checks that the port is free, then holds an exclusive lock
named for the address while its workers run. A second group on the same port
finds the lock taken; a single server (SO_REUSEPORT off) cannot bind into a
group, and a group cannot bind onto a single server (docs/decisions.md).
Workers die with the supervisor (parent-death signal) and are restarted when
they die alone. With --http-listen host:P, worker i serves its own admin HTTP
port P+i (/metrics are per process; docs/decisions.md).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from delayq_server import config, cpu_affinity
from delayq_server.managed_redis import _die_with_parent, free_port

log = logging.getLogger("delayq.workers")

REUSE_PORT_ENV = "DELAYQ_REUSE_PORT"  # set for workers only: join the port group
RESTART_BACKOFF_S = 1.0


def _lock_port(host: str, port: int) -> IO[str]:
    path = Path(tempfile.gettempdir()) / f"delayq-{host.strip('[]')}-{port}.lock"
    lock = open(path, "a+")  # noqa: SIM115 - held for the life of the group
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        config.fail(f"--listen: {host}:{port} is served by another delayq --workers group ({path})")
    return lock


class Supervisor:
    def __init__(self, cfg: config.Config, argv: Sequence[str], redis_url: str) -> None:
        self.cfg = cfg
        host, _, port = cfg.listen.rpartition(":")
        self.host = host
        self.port = int(port) or free_port()
        self.argv = [*argv, "--listen", f"{host}:{self.port}", "--redis-url", redis_url]
        # Each worker has its own metrics, so its own admin HTTP port: worker i
        # serves --http-listen's port + i (any free port each when it is 0).
        self.http: tuple[str, int] | None = None
        if cfg.http_listen:
            http_host, _, http_port = cfg.http_listen.rpartition(":")
            self.http = (http_host, int(http_port))
        self.procs: list[subprocess.Popen[str] | None] = [None] * cfg.workers
        self.ready = [threading.Event() for _ in range(cfg.workers)]
        self.stopping = threading.Event()

    def http_listen(self, i: int) -> list[str]:
        if self.http is None:
            return []
        host, port = self.http
        return ["--http-listen", f"{host}:{port + i if port else 0}"]

    def _spawn(self, i: int) -> None:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "delayq_server",
                *self.argv,
                *self.http_listen(i),
                "--cpu-affinity",
                cpu_affinity.for_worker(self.cfg.cpu_affinity, i),
                "--workers",
                "1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, REUSE_PORT_ENV: "1", "PYTHONUNBUFFERED": "1"},
            preexec_fn=_die_with_parent(os.getpid()),
        )
        self.procs[i] = proc
        threading.Thread(target=self._relay, args=(i, proc), daemon=True).start()

    def _relay(self, i: int, proc: subprocess.Popen[str]) -> None:
        """Forwards a worker's output, prefixed, so only our own line says 'listening'."""
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("delayq: listening on "):
                self.ready[i].set()
            sys.stdout.write(f"[worker {i}] {line}")
            sys.stdout.flush()

    def run(self) -> int:
        from delayq_server.app import StartupError, check_bind

        try:
            check_bind(f"{self.host}:{self.port}")  # nobody, group or single, holds it
            for i in range(self.cfg.workers):
                if self.http is not None and self.http[1]:
                    check_bind(self.http_listen(i)[1])
        except StartupError as exc:
            config.fail(str(exc))
        lock = _lock_port(self.host, self.port)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        try:
            for i in range(self.cfg.workers):
                self._spawn(i)
            deadline = time.monotonic() + 60
            for i, ready in enumerate(self.ready):
                while not ready.wait(0.1):
                    proc = self.procs[i]
                    if proc is not None and proc.poll() is not None:
                        config.fail(f"worker {i} exited with status {proc.returncode} at start")
                    if time.monotonic() > deadline:
                        config.fail(f"worker {i} did not start within 60 s")
            log.info("%d workers serve %s:%d", self.cfg.workers, self.host, self.port)
            # The same line a single server prints (tests and scripts wait for it).
            print(f"delayq: listening on {self.host}:{self.port}", flush=True)
            while not self.stopping.wait(0.2):
                for i, proc in enumerate(self.procs):
                    if proc is not None and proc.poll() is not None:
                        log.warning("worker %d exited with %s; restarting", i, proc.returncode)
                        time.sleep(RESTART_BACKOFF_S)
                        self._spawn(i)
            return self._stop()
        finally:
            lock.close()

    def _stop(self) -> int:
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.cfg.grace_ms / 1000 + 15
        status = 0
        for proc in self.procs:
            if proc is None:
                continue
            try:
                code = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            status = status or (code if code > 0 else 0)
        return status
