"""A timer loop under uvloop (the server's event loop) sleeps once per due time (issue 12)."""

from __future__ import annotations

import asyncio
import time

import uvloop

from delayq_server.timers.base import Loop


class UntilDue(Loop):
    """Ticks like the promoter: due -> act, not yet -> sleep the rest (never early)."""

    def __init__(self, gaps_s: list[float]) -> None:
        super().__init__()
        self.gaps_s = gaps_s
        self.due = 0.0
        self.ticks = 0
        self.early = 0
        self.acted = 0
        self.done = asyncio.Event()

    async def tick(self) -> float | None:
        self.ticks += 1
        now = time.monotonic()
        if self.due and now < self.due:
            return self.due - now
        if self.due:
            self.acted += 1
        if not self.gaps_s:
            self.done.set()
            return None
        self.due = now + self.gaps_s.pop()
        return self.due - now


def test_a_sleep_until_a_due_time_does_not_end_early_and_spin() -> None:
    # Gaps of 0.3 to 2.9 ms, as due times at 1,000 jobs/s are apart.
    gaps = [(3 + 26 * (i * 7 % 11) / 10) / 1000 for i in range(200)]

    async def run() -> UntilDue:
        loop = UntilDue(list(gaps))
        loop.start()
        await asyncio.wait_for(loop.done.wait(), 60)
        await loop.stop()
        return loop

    loop = uvloop.run(run())
    assert loop.acted == len(gaps)
    # One sleep and one tick that acts per due time, and the odd early wake-up
    # (uvloop's clock is cached per iteration). Sleeps ending before the due
    # time made it 5 to 7 ticks per due time, most of them 0 ms re-sleeps.
    assert loop.ticks <= 2.5 * len(gaps), loop.ticks / len(gaps)
