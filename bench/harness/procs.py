"""Processes the harness owns: fresh redis-server instances, delayq servers, runners."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """Return a loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], grace: float = 5.0) -> None:
    """Stop a child we started: SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def redis_server() -> Iterator[tuple[str, int]]:
    """Start an empty, non-persistent redis-server on a free port; yield (URL, pid)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: run `make system-deps`")
    workdir = tempfile.mkdtemp(prefix="delayq-bench-redis-")
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory-policy",
            "noeviction",
            "--dir",
            workdir,
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {port} did not start") from None
                time.sleep(0.02)
        client.close()
        yield url, proc.pid
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def used_memory(url: str) -> int:
    """Redis' own count of allocated bytes (INFO memory used_memory)."""
    client = redis.Redis.from_url(url)
    try:
        info = client.info("memory")
        return int(info["used_memory"])
    finally:
        client.close()


def redis_time(url: str) -> float:
    """Redis TIME as Unix seconds (the clock delayq schedules by)."""
    client = redis.Redis.from_url(url)
    try:
        seconds, micros = client.time()
        return float(seconds) + float(micros) / 1e6
    finally:
        client.close()


@contextlib.contextmanager
def delayq_server(redis_url: str, python: str, log: Path) -> Iterator[tuple[str, int]]:
    """Start `python -m delayq_server` on a free port; yield (address, pid) once it listens.

    Its log (stderr) goes to `log`."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            [python, "-m", "delayq_server", "--redis-url", redis_url, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE,
            stderr=log_file,
            text=True,
            env=env,
            cwd=REPO,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        prefix = "delayq: listening on "
        if not line.startswith(prefix):
            raise RuntimeError(f"delayq server did not start (first line: {line!r})")
        # Keep reading so a chatty server never blocks on a full pipe.
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield line[len(prefix) :], proc.pid
    finally:
        stop(proc)
