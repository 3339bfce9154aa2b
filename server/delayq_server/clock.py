"""The server's own wall clock, with a test-only skew (docs/chaos.md: "Clock skew")."""

from __future__ import annotations

import time

# Due times, lease deadlines and every other promise use Redis TIME (docs/decisions.md);
# the local clock only stamps job ids. The chaos suite skews it by minutes on one
# replica to show that nothing that decides *when* a job runs reads it.
_skew_ns = 0


def set_skew_ms(skew_ms: int) -> None:
    """Shifts every later ``wall_ns()`` read by ``skew_ms`` (negative: behind)."""
    global _skew_ns
    _skew_ns = skew_ms * 1_000_000


def wall_ns() -> int:
    """Local wall-clock time in ns, skewed by the ``--clock-skew`` setting."""
    return time.time_ns() + _skew_ns
