"""Helpers for the processes the harness owns.

redis-server and the delayq server are started with the project's own
ManagedRedis and DelayqProcess (see runs.py); this module keeps what is
bench-specific: stopping runners and reading Redis figures."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[2]


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
