"""Pieces every runner shares (stdlib only: the arq runner imports it from its own venv)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

# The same 100-byte payload for every system (ASCII so that JSON peers carry it as is).
PAYLOAD = ("delayq-bench-payload-" * 5)[:100]
QUEUE = "bench"


class Progress:
    """Prints `label: done/total` to stderr at most every `every` seconds."""

    def __init__(self, label: str, total: int, every: float = 2.0) -> None:
        self.label = label
        self.total = total
        self.every = every
        self.last = time.monotonic()

    def update(self, done: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every:
            self.last = now
            print(f"    {self.label}: {done:,}/{self.total:,}", file=sys.stderr, flush=True)


def due_times_ms(lead_s: float, jobs: int, rate: float) -> list[int]:
    """Whole-ms due times drawn at random (fixed seed) over jobs/rate seconds, sorted, the
    first window starting lead_s from now: every system takes a ms due time, so the
    requested time is exactly what each stores."""
    rng = random.Random(7)
    t0 = time.time() * 1000 + lead_s * 1000
    span = jobs / rate * 1000
    return sorted(int(t0 + rng.random() * span) for _ in range(jobs))


class LatenessLog:
    """Lateness samples of one lateness run, with the counts the harness checks."""

    def __init__(self, label: str, jobs: int, clock: str) -> None:
        self.jobs = jobs
        self.clock = clock
        self.samples: list[float] = []
        self.seen: set[str] = set()
        self.duplicates = 0
        self.late_enqueues = 0
        self.progress = Progress(label, jobs)

    def record(self, job_id: str, lateness_ms: float) -> None:
        if job_id in self.seen:
            self.duplicates += 1
        self.seen.add(job_id)
        self.samples.append(lateness_ms)
        self.progress.update(len(self.samples))

    @property
    def complete(self) -> bool:
        return len(self.samples) >= self.jobs

    def result(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "received": len(self.samples),
            "duplicates": self.duplicates,
            "late_enqueues": self.late_enqueues,
            "lateness_ms": self.samples,
            "clock": self.clock,
        }


class Holder:
    """Worker A of the redelivery scenario: a child that takes one job, prints
    `held <job id>` and never acks; killed with SIGKILL (or frozen with SIGSTOP) while it
    holds the job."""

    def __init__(self, *command: str) -> None:
        self.command = command
        self.proc: asyncio.subprocess.Process | None = None

    async def __aenter__(self) -> Holder:
        self.proc = await asyncio.create_subprocess_exec(
            *self.command, stdout=asyncio.subprocess.PIPE
        )
        return self

    async def __aexit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            if self.proc.returncode is None:
                self.proc.kill()
            await self.proc.wait()

    async def held(self) -> str:
        """The id of the job worker A took (it has 30 s to take it)."""
        assert self.proc is not None and self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), 30)).decode()
        if not line.startswith("held "):
            raise RuntimeError(f"worker A did not take the job: {line!r}")
        return line.split()[1]

    def kill(self, how: str = "KILL") -> float:
        """SIGKILL (or SIGSTOP: frozen, connections open) worker A; the perf_counter time."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP if how == "STOP" else signal.SIGKILL)
        return time.perf_counter()


def runner_args(description: str) -> argparse.Namespace:
    """Command line shared by the runners: SCENARIO --redis-url --params JSON --out FILE."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("scenario")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--target", default="", help="delayq server address (delayq only)")
    parser.add_argument("--params", default="{}", help="scenario parameters as JSON")
    parser.add_argument("--out", default="", help="where to write the result JSON")
    return parser.parse_args()


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write a runner's result where the harness reads it."""
    Path(path).write_text(json.dumps(result))
