"""Promoter: sleeps until a shard's next due time, then moves due jobs to ready.

When a Consume stream on this replica waits idle for the shard, the due time
wakes that stream instead: its claim promotes and leases the due jobs in one
script call (claim.lua) and reports the next due time back here. That skips a
promote call and a "ready" pub/sub round trip per due time, most of the
server's CPU at a steady 1,000 due jobs/s (docs/decisions.md, timer CPU).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from delayq_server import events
from delayq_server.store import ShardKeys, Store
from delayq_server.store.store import PROMOTE_LIMIT
from delayq_server.timers.base import Loop

# How long a woken stream has to report back before the promoter promotes
# itself: the stream may have closed, or its claim failed.
DELEGATE_WAIT_S = 0.01
# Due times closer together than this share one wake-up (the later one waits
# for the earlier's turn): at 1,000 due jobs/s a wake-up per due ms cost more
# CPU than the jobs themselves. Adds at most this much lateness, only when
# jobs fall due faster than one per interval (issue 12).
COALESCE_S = 0.002  # --timer-coalesce


@dataclass(frozen=True, slots=True)
class Waiters:
    """This replica's idle streams, as the promoter sees them (the ready board)."""

    waiting: Callable[[str], bool]  # an idle stream with credit consumes the shard
    wake: Callable[[str], None]  # wakes one such stream for the shard


class _Wake(asyncio.Event):
    """The promoter's wake-up; remembers whether anything but a claim report set it.

    Events ("due"), ownership changes and re-subscribes set it the usual way and
    mean "ask Redis"; a claim's report only moves the time to sleep until.
    """

    def __init__(self) -> None:
        super().__init__()
        self.external = False

    def set(self) -> None:
        self.external = True
        super().set()

    def report(self) -> None:
        super().set()


class Promoter(Loop):
    """One per shard. Woken early by "due" events (an earlier job arrived)."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        keys: ShardKeys,
        owns: Callable[[], bool] = lambda: True,
        waiters: Waiters | None = None,
        coalesce_s: float = COALESCE_S,
    ) -> None:
        super().__init__()
        self._wake = self.wake = _Wake()
        self.name = f"promoter {keys.tag}"
        self._store, self._hub, self._keys, self._owns = store, hub, keys, owns
        self._waiters = waiters
        self._coalesce_s = coalesce_s
        # What we last learnt of the backlog: next due ms (None: empty), Redis'
        # now then, and our monotonic clock then. None: unknown, ask Redis.
        self._head: tuple[int | None, int, float] | None = None
        self._seen_now = 0  # Redis ms of the newest report taken (older ones are stale)
        self._acted_at = 0.0  # monotonic time of the last promote or hand-over
        self._handed_over = False  # a woken stream's report is awaited
        hub.subscribe(events.DUE, keys.tag, self.wake)

    def report(self, next_due_ms: int | None, now_ms: int) -> None:
        """A claim on this replica read the backlog head at Redis time ``now_ms``.

        Reports older than what we know are dropped: an enqueue may have added
        an earlier job since, and its "due" event made us ask Redis already.
        """
        # The awaited report may share its ms with the last one (a claim on
        # returned credit): taken, unless a promote ran since (it clears the wait).
        if now_ms < self._seen_now or (now_ms == self._seen_now and not self._handed_over):
            return
        self._handed_over = False
        self._seen_now = now_ms
        mono = time.monotonic()
        self._head = (next_due_ms, now_ms, mono)
        if not self._owns():
            return  # another replica promotes; gaining the shard wakes us (manager.py)
        if next_due_ms is None:
            self.idle = True
            self.wake_in(self.fallback_s)
            return
        # Re-plan the sleep in place, as tick would from this head: a task step
        # and a tick per claim were a good part of the CPU per due time (issue 12).
        self.idle = False
        self.wake_in(max((next_due_ms - now_ms) / 1000, self._acted_at + self._coalesce_s - mono))

    def nudge(self) -> None:
        self._wake.report()  # a report only moves the time: no Redis call

    async def tick(self) -> float | None:
        if not self._owns():
            self.idle = True  # nothing for this replica to do here
            self._head = None
            return None  # another replica promotes; woken again when we own the shard
        external, self._wake.external = self._wake.external, False
        if not external and self._head is not None:
            next_due, seen_now, seen_at = self._head
            if next_due is None:
                self.idle = True
                return None
            self.idle = False
            mono = time.monotonic()
            now = seen_now + (mono - seen_at) * 1000
            wait = max((next_due - now) / 1000, self._acted_at + self._coalesce_s - mono)
            if wait > 0:
                return wait
            self._acted_at = mono
            if self._waiters is not None and self._waiters.waiting(self._keys.tag):
                # Due, and a stream here waits: its claim promotes (never early:
                # claim.lua checks against Redis' clock) and reports back.
                self._head = None
                self._handed_over = True
                self._waiters.wake(self._keys.tag)
                return DELEGATE_WAIT_S
        self._acted_at = time.monotonic()
        self._handed_over = False
        res = await self._store.promote(self._keys, PROMOTE_LIMIT)
        self.idle = res.next_due_ms is None
        if res.now_ms >= self._seen_now:
            self._seen_now = res.now_ms
            self._head = (res.next_due_ms, res.now_ms, time.monotonic())
        # promote.lua publishes the "ready" wake-up for every replica, this one too.
        if res.moved >= PROMOTE_LIMIT:
            self._head = None
            return 0  # more are due: go again at once (each call is bounded)
        if res.next_due_ms is None:
            return None
        # Relative to Redis' clock as the script saw it, so local skew never
        # makes us promote early (the script re-checks against TIME anyway).
        return max(0.0, (res.next_due_ms - res.now_ms) / 1000)

    async def stop(self) -> None:
        self._hub.unsubscribe(events.DUE, self._keys.tag, self.wake)
        await super().stop()
