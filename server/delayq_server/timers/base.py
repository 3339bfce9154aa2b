"""Shared shape of a background loop: start, stop, one tick calling one store method."""

from __future__ import annotations

import asyncio
import contextlib
import logging

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

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def tick(self) -> float | None:
        raise NotImplementedError

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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self.wake.wait()
