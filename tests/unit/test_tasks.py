"""Background tasks stop even when a cancellation is swallowed (delayq_server/tasks.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from delayq_server.tasks import cancel_and_wait
from delayq_server.timers.base import Loop


async def _ends_by_itself(stopping: Coroutine[Any, Any, None]) -> None:
    """Awaits ``stopping`` without ever cancelling it (wait_for would, and a
    cancelled ``await task`` passes that cancellation on to the task)."""
    stopper = asyncio.create_task(stopping)
    done, _ = await asyncio.wait({stopper}, timeout=30)  # generous: one retry is 1 s
    if stopper not in done:
        stopper.cancel()
        raise AssertionError("stopping hung on the swallowed cancellation")
    stopper.result()


async def _swallows_one_cancel(swallowed: list[bool]) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)  # as a timeout racing the cancellation would


async def test_a_task_that_swallows_a_cancellation_is_cancelled_again() -> None:
    swallowed: list[bool] = []
    task = asyncio.create_task(_swallows_one_cancel(swallowed))
    await asyncio.sleep(0)
    await _ends_by_itself(cancel_and_wait(task, retry_s=0.05))
    assert swallowed == [True] and task.cancelled()


async def test_a_loop_stops_though_its_tick_swallowed_the_cancellation() -> None:
    ticks: list[int] = []

    class Stubborn(Loop):
        async def tick(self) -> float | None:
            ticks.append(1)
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if len(ticks) > 1:
                    raise
            return 0  # go round again, as after a timeout taken for "look again"

    loop = Stubborn()
    loop.start()
    await asyncio.sleep(0)
    await _ends_by_itself(loop.stop())
    assert len(ticks) == 2


async def test_other_exceptions_reach_the_caller() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    try:
        await cancel_and_wait(task)
    except RuntimeError as exc:
        assert str(exc) == "cleanup failed"
    else:
        raise AssertionError("the exception was swallowed")
