"""Stopping background tasks so that shutdown cannot hang on a swallowed cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

RETRY_S = 1.0  # how long one cancellation gets before the next is sent


async def cancel_and_wait(task: asyncio.Task[Any], retry_s: float = RETRY_S) -> None:
    """Cancels ``task`` and waits until it has ended, cancelling again while it runs.

    One cancellation is not always enough. On Python 3.11 an ``asyncio.timeout`` that
    expires in the same loop step as the cancellation can turn it into TimeoutError,
    which loops that treat a timeout as "look again" (timers/base.py) catch, and the
    pub/sub listener, the timers' refresher and the queue gauges go on after any
    Exception. A plain ``cancel(); await task``
    then waits forever: a store test's teardown once hung there for its whole timeout.
    Exceptions other than the cancellation still reach the caller.
    """
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
    with contextlib.suppress(asyncio.CancelledError):
        await task
