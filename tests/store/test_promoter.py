"""The promoter hands due times to an idle local stream, whose claim promotes (issue 12)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from delayq_server import events
from delayq_server.store import Claimed, ShardKeys, Store
from delayq_server.store.store import PROMOTE_LIMIT, PromoteResult
from delayq_server.timers.promoter import Promoter, Waiters
from tests.store.test_background import until
from tests.support.seed import KEYS, spec


class Stream:
    """An idle stream as the ready board shows it: woken, it claims like ConsumeStream."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.idle = True
        self.claimed: list[tuple[Claimed, int]] = []  # with Redis' now at receipt
        self.tasks: set[asyncio.Task[None]] = set()

    def wake(self, tag: str) -> None:
        assert tag == KEYS.tag
        task = asyncio.create_task(self._claim())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _claim(self) -> None:
        for c in await self.store.claim(KEYS, 100, 30_000, "t.1.0."):
            self.claimed.append((c, await self.store.time_ms()))


@pytest.fixture
async def promoted(store: Store) -> AsyncIterator[tuple[Promoter, Stream, list[int]]]:
    stream = Stream(store)
    promotes: list[int] = []
    real = store.promote

    async def counted(
        keys: ShardKeys, limit: int = PROMOTE_LIMIT, now_ms: int | None = None
    ) -> PromoteResult:
        res = await real(keys, limit, now_ms)
        promotes.append(res.moved)
        return res

    store.promote = counted  # type: ignore[method-assign]  # counts calls, Redis is real
    promoter = Promoter(
        store, events.EventHub(), KEYS, waiters=Waiters(lambda t: stream.idle, stream.wake)
    )
    store.on_backlog_head = lambda keys, due, now: promoter.report(due, now)
    promoter.fallback_s = 3600  # delivery must never wait for the last-resort timer
    promoter.start()
    yield promoter, stream, promotes
    await promoter.stop()


async def test_due_jobs_reach_an_idle_stream_without_promote_calls(
    store: Store, promoted: tuple[Promoter, Stream, list[int]]
) -> None:
    promoter, stream, promotes = promoted
    await until(lambda: promotes)  # the first tick asks Redis (nothing is known yet)
    now = await store.time_ms()
    jobs = [spec(due_at_ms=now + 300 + 40 * i) for i in range(5)]
    await store.enqueue(KEYS, jobs)
    promoter.wake.set()  # what enqueue.lua's "due" event does
    await until(lambda: len(stream.claimed) == 5)
    for c, _ in stream.claimed:
        assert c.record.last_delivery_ms >= c.record.due_ms  # never early
    # After the event's promote call, every due time went straight to the stream.
    assert promotes == [0, 0]
    assert await store.redis.llen(KEYS.ready) == 0


async def test_without_an_idle_stream_the_promoter_promotes(
    store: Store, promoted: tuple[Promoter, Stream, list[int]]
) -> None:
    promoter, stream, promotes = promoted
    stream.idle = False
    now = await store.time_ms()
    await store.enqueue(KEYS, [spec(due_at_ms=now + 200)])
    promoter.wake.set()
    await until(lambda: sum(promotes) == 1)
    assert stream.claimed == [] and await store.redis.llen(KEYS.ready) == 1


async def test_a_stale_report_does_not_move_the_wake_up_later(
    store: Store, promoted: tuple[Promoter, Stream, list[int]]
) -> None:
    promoter, stream, promotes = promoted
    stream.idle = False
    await until(lambda: promotes)
    now = await store.time_ms()
    await store.enqueue(KEYS, [spec(due_at_ms=now + 300)])
    promoter.wake.set()
    await until(lambda: len(promotes) == 2)
    # A claim that read the backlog before that enqueue reports a later head: dropped.
    promoter.report(now + 3_600_000, now - 1)
    await until(lambda: sum(promotes) == 1, within=10)


async def test_the_awaited_report_counts_even_in_the_same_ms(
    store: Store, promoted: tuple[Promoter, Stream, list[int]]
) -> None:
    """A claim on returned credit reported at ms T; the woken stream's claim reports at T
    too: that report sets the next wake-up (no 10 ms wait and promote call)."""
    promoter, stream, promotes = promoted
    await until(lambda: promotes)
    now = await store.time_ms()
    await store.enqueue(KEYS, [spec(due_at_ms=now + 200), spec(due_at_ms=now + 400)])
    promoter.wake.set()
    await until(lambda: len(promotes) == 2)
    real_claim = stream._claim

    async def same_ms_claim() -> None:
        # Another claim reported this very ms before the woken stream's own report.
        seen = promoter._seen_now
        promoter.report(now + 400, seen)
        store.on_backlog_head = lambda keys, due, t: promoter.report(due, seen)
        await real_claim()
        store.on_backlog_head = lambda keys, due, t: promoter.report(due, t)

    stream._claim = same_ms_claim  # type: ignore[method-assign]
    await until(lambda: len(stream.claimed) == 2)
    assert len(promotes) == 2  # both due times went to the stream: no fallback promote


async def test_a_report_moves_the_sleep_without_a_tick(
    store: Store, promoted: tuple[Promoter, Stream, list[int]]
) -> None:
    """The woken stream's report re-plans the promoter's timer in place: the loop
    runs once per handed-over due time, not once more per report (issue 12, timer CPU)."""
    promoter, stream, promotes = promoted
    await until(lambda: promotes)
    ticks: list[bool] = []  # whether the tick handed a due time over
    real_tick = promoter.tick

    async def counted() -> float | None:
        before = promoter._handed_over
        out = await real_tick()
        ticks.append(promoter._handed_over and not before)
        return out

    promoter.tick = counted  # type: ignore[method-assign]
    now = await store.time_ms()
    await store.enqueue(KEYS, [spec(due_at_ms=now + 300 + 60 * i) for i in range(4)])
    promoter.wake.set()
    await until(lambda: len(stream.claimed) == 4)
    await until(lambda: not stream.tasks)
    # One tick for the event (it promotes nothing: nothing is due yet), then per
    # due time the tick that hands it over, and at most one more for a timer that
    # fired a little early; never one per report.
    handed = sum(ticks)
    assert handed == 4
    assert len(ticks) - 1 - handed <= handed // 2, ticks
