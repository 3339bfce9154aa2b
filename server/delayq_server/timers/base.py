"""Shared shape of a background loop: start, stop, one tick calling one store method."""

from __future__ import annotations

import asyncio
import logging

from delayq_server.tasks import cancel_and_wait

log = logging.getLogger(__name__)

# Longest sleep without a wake-up. Wake-ups lost while pub/sub was disconnected
# are covered by waking every loop on resubscribe; this is the last resort.
FALLBACK_S = 30.0
ERROR_BACKOFF_S = 0.5


class Loop:
    """Runs ``tick`` until stopped; ``tick`` returns how long to sleep (None = fallback).

    The sleep ends early when ``wake`` is set, so event-driven loops react at once.
    """

    name = "loop"

    def __init__(self) -> None:
        self.wake = asyncio.Event()
        self.fallback_s = FALLBACK_S
        self.idle = False  # the last tick found nothing pending (see manager.py)
        self._task: asyncio.Task[None] | None = None
        self._sleep: asyncio.Timeout | None = None  # the sleep under way, if any

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait(self._task)

    async def tick(self) -> float | None:
        raise NotImplementedError

    def wake_in(self, delay: float) -> None:
        """Ends the sleep under way after ``delay`` s instead (at once when <= 0).

        Moves the timer in place: no task step, no tick, unlike ``wake`` (a
        claim's report re-plans the promoter once per due time, issue 12).
        """
        sleep = self._sleep
        # An expired sleep's task is about to tick anyway; a missing one is ticking.
        if delay <= 0 or sleep is None or sleep.expired():
            self.nudge()
            return
        sleep.reschedule(asyncio.get_running_loop().time() + delay)

    def nudge(self) -> None:
        """Ends the sleep now (``wake_in``'s way; a loop may tell it from ``wake``)."""
        self.wake.set()

    async def _run(self) -> None:
        while True:
            self.wake.clear()
            try:
                delay = await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("%s: %s", self.name, exc)
                delay = ERROR_BACKOFF_S
            if delay is not None and delay <= 0:
                continue
            timeout = self.fallback_s if delay is None else min(delay, self.fallback_s)
            # asyncio.timeout, not wait_for: no task per sleep (a promoter sleeps
            # once or twice per due time, issue 12).
            try:
                async with asyncio.timeout(timeout) as self._sleep:
                    await self.wake.wait()
            except TimeoutError:
                pass
            finally:
                self._sleep = None
