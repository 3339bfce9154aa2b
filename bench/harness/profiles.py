"""Where the time goes: CPU seconds per process during a run, and py-spy stack summaries."""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
LINE = re.compile(r":\d+\)$")


def cpu_ticks(pid: int) -> int | None:
    """utime + stime of a live process, in clock ticks (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


class CpuSampler:
    """Samples the CPU time of named processes every 0.1 s until stopped.

    The last sample before a process exits stands for its total, so a runner that
    ends between samples loses at most 0.1 s of CPU.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.first: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.started = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self._sample()
        self.thread.start()

    def _sample(self) -> None:
        for name, pid in self.pids.items():
            ticks = cpu_ticks(pid)
            if ticks is not None:
                self.first.setdefault(name, ticks)
                self.last[name] = ticks

    def _loop(self) -> None:
        while not self.done.wait(0.1):
            self._sample()

    def stop(self) -> dict[str, float]:
        """Wall seconds and CPU seconds per process (a share of one core = cpu / wall)."""
        self.done.set()
        self.thread.join()
        wall = time.monotonic() - self.started
        out = {"wall_s": round(wall, 3)}
        for name in self.pids:
            if name in self.first:
                out[f"{name}_cpu_s"] = round((self.last[name] - self.first[name]) / TICK, 3)
        return out


def summarize(raw: Path, top: int = 25) -> str:
    """Top functions by self and by inclusive samples from py-spy's collapsed (raw) output."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        # "func (file:line)" -> "func (file)": time per function, not per line.
        frames = [LINE.sub(")", f) for f in stack.split(";")]
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return f"{raw.name}: no samples\n"
    lines = [f"{raw.name}: {total} samples (250/s, busy threads only)", "", "self:"]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in own.most_common(top)]
    lines += ["", "inclusive (delayq frames and grpc/redis entry points):"]
    shown = [
        (f, n)
        for f, n in inclusive.most_common()
        if any(k in f for k in ("delayq", "grpc", "redis", "protobuf", "bench/"))
    ]
    lines += [f"  {n / total:6.1%}  {f}" for f, n in shown[:top]]
    return "\n".join(lines) + "\n"
