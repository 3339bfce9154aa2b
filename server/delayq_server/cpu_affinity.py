"""`--cpu-affinity`: keep each server process's threads on one CPU.

grpc.aio hands every read and write between its own threads (the completion-queue
poller, EventEngine's workers) and the thread that runs the event loop: a unary call
wakes four to six threads of this process. Where waking a thread on another CPU is
expensive, as in the microVM the benchmark runs on, those hand-offs cost more than the
call's own work: a thread ping-pong there takes ~100 µs per round trip across CPUs and
~10 µs on one CPU. Kept on one CPU, a bare grpc.aio echo server spent ~30% less CPU per
call and answered ~0.15 ms sooner (docs/decisions.md, "one CPU per server process").
A busy server can lose by it: its grpc threads' C work (framing, reads, writes) no
longer runs beside the event loop on another CPU (the benchmark's drain was slower in
one set of runs and not in the next).

Off by default, for that and because a fixed CPU is a surprise wherever the CPUs a
process may use are not its own: a container limited by a CPU quota but not a cpuset
sees every CPU of the host, and every such server would crowd onto the same one.
Operators who give the server its CPUs turn it on: `auto` spreads the server processes
(`--workers`) over the CPUs this process may use, one CPU each; a list (`2`, `2,3`,
`0-3`) names them.
"""

from __future__ import annotations

import contextlib
import logging
import os

log = logging.getLogger("delayq")

OFF, AUTO = "off", "auto"


class AffinityError(ValueError):
    """A --cpu-affinity value that names no CPU this process may use."""


def _ranges(allowed: set[int]) -> str:
    """`0-3,6`: a CPU set written as Linux writes cpu lists."""
    runs: list[list[int]] = []
    for cpu in sorted(allowed):
        if runs and runs[-1][1] == cpu - 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def cpus(spec: str, allowed: set[int] | None = None) -> list[int]:
    """The CPUs `spec` names, in the order server processes take them; [] for off.

    `allowed` is the set this process may run on (its affinity, by default).
    """
    spec = spec.strip().lower()
    if spec == OFF:
        return []
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    if spec == AUTO:
        return sorted(allowed)
    out: list[int] = []
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise AffinityError(
                f"{part.strip()!r} is not a CPU number or range: want off, auto, or a list "
                "such as 1, 2,3 or 0-3"
            )
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise AffinityError(f"{part.strip()!r}: a range runs from low to high")
        for cpu in range(first, last + 1):
            if cpu not in allowed:
                raise AffinityError(
                    f"CPU {cpu} is not one this process may use ({_ranges(allowed)})"
                )
            if cpu not in out:
                out.append(cpu)
    return out


def for_worker(spec: str, index: int) -> str:
    """The --cpu-affinity of worker `index` of a --workers group: one CPU of `spec`'s
    list, taken in turn; `spec` itself when it is off."""
    listed = cpus(spec)
    return str(listed[index % len(listed)]) if listed else OFF


def pin(spec: str) -> None:
    """Keeps every thread of this process, and so every thread it starts later (they
    inherit their creator's mask), on the first CPU `spec` names; nothing when off.

    Linux's sched_setaffinity(0) moves only the calling thread: threads that already
    run (grpc's, at import) are moved one by one.
    """
    listed = cpus(spec)
    if not listed:
        return
    cpu = listed[0]
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended since
            os.sched_setaffinity(int(tid), {cpu})
    log.info("server threads kept on CPU %d (--cpu-affinity)", cpu)
