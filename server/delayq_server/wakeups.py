"""The ready board: which shards may hold ready jobs, and which idle streams to wake.

A "ready <n>" event (a script pushed n jobs into an empty ready list) hints its
shard and wakes the idle streams of this replica that consume it, longest idle
first, only as many as have credit for the n jobs: one stream for one job, not
all of them (BullMQ's marker model). A stream whose claim took all it asked for
passes the wake-up on to the next idle stream (jobs may remain: other replicas'
events, or a count the board never saw); a claim that comes back short clears
the hint. Streams only go idle when none of their shards is hinted, and the
check and the registration happen in one step of the event loop, so a hint
can never fall between a claim and the wait (docs/decisions.md, wake-ups).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, defaultdict
from collections.abc import Iterable
from typing import Protocol


class Waiter(Protocol):
    """What the board needs of a stream: a way to wake it."""

    def wake_up(self, tag: str | None = None) -> None: ...

    @property
    def credit(self) -> int: ...


class ReadyBoard:
    def __init__(self) -> None:
        # tag -> generation of its latest hint; insertion-ordered, so the shard
        # that fired first is claimed first. The generation keeps a claim that
        # started before an event from clearing the hint that event set.
        self._hinted: dict[str, int] = {}
        self._generation = itertools.count(1)
        # tag -> idle streams in the order they went idle (woken oldest first).
        self._idle: dict[str, OrderedDict[Waiter, None]] = defaultdict(OrderedDict)
        self._waiting: dict[Waiter, list[str]] = {}  # idle stream -> its tags
        self.wakeups = 0  # streams woken by events, for tests and metrics

    def fire(self, tag: str, jobs: int = 1) -> None:
        """``jobs`` became ready on ``tag``: hint it and wake idle streams with
        credit for them (at least one)."""
        self._hinted[tag] = next(self._generation)
        self.pass_on(tag, jobs)

    def pass_on(self, tag: str, jobs: int = 1) -> None:
        """Wakes the longest-idle streams that consume ``tag`` until their credit
        covers ``jobs``."""
        waiters = self._idle.get(tag)
        while waiters and jobs > 0:
            waiter = next(iter(waiters))
            self._forget(waiter)  # woken once; it registers again when it goes idle
            self.wakeups += 1
            jobs -= max(1, waiter.credit)
            waiter.wake_up(tag)

    def _forget(self, waiter: Waiter) -> None:
        for tag in self._waiting.pop(waiter, ()):
            waiters = self._idle.get(tag)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._idle[tag]

    def hinted(self, tags: Iterable[str]) -> dict[str, int]:
        """The given tags that may hold ready jobs (first fired first), with the
        generation to hand back to ``drained``."""
        wanted = set(tags)
        return {t: g for t, g in self._hinted.items() if t in wanted}

    def hint_all(self, tags: Iterable[str]) -> None:
        """After a possible loss of events (fallback, re-subscribe): assume work."""
        for tag in tags:
            self._hinted[tag] = next(self._generation)

    def drained(self, tag: str, generation: int) -> None:
        """A claim on ``tag``, made under hint ``generation``, came back short:
        the ready list is empty unless an event hinted it again since."""
        if self._hinted.get(tag) == generation:
            del self._hinted[tag]

    def has_idle(self, tag: str) -> bool:
        return bool(self._idle.get(tag))

    def go_idle(
        self, waiter: Waiter, tags: Iterable[str], *, force: bool = False, front: bool = False
    ) -> bool:
        """Registers an idle stream; refuses (False) when one of its tags is hinted,
        unless ``force`` (the stream just passed its turn on to another). A stream
        woken for nothing (another took the jobs) keeps its place: ``front``."""
        tags = list(tags)
        if not force and any(t in self._hinted for t in tags):
            return False
        for tag in tags:
            waiters = self._idle[tag]
            waiters[waiter] = None
            if front:
                waiters.move_to_end(waiter, last=False)
        self._waiting[waiter] = tags
        return True

    def stop_idle(self, waiter: Waiter) -> None:
        self._forget(waiter)
