"""The ready board: which shards may hold ready jobs, and which idle stream to wake.

A "ready" event (a script pushed jobs into an empty ready list) hints its
shard and wakes ONE idle stream of this replica that consumes it, not all of
them (BullMQ's marker model). A stream whose claim took all it asked for
passes the wake-up on to the next idle stream, so a burst reaches as many
streams as there are jobs and credit; a claim that comes back short clears
the hint. Streams only go idle when none of their shards is hinted, and the
check and the registration happen in one step of the event loop, so a hint
can never fall between a claim and the wait (docs/decisions.md, wake-ups).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from typing import Protocol


class Waiter(Protocol):
    """What the board needs of a stream: a way to wake it."""

    def wake_up(self, tag: str | None = None) -> None: ...


class ReadyBoard:
    def __init__(self) -> None:
        # tag -> generation of its latest hint; insertion-ordered, so the shard
        # that fired first is claimed first. The generation keeps a claim that
        # started before an event from clearing the hint that event set.
        self._hinted: dict[str, int] = {}
        self._generation = itertools.count(1)
        # tag -> idle streams in the order they went idle (woken oldest first).
        self._idle: dict[str, dict[Waiter, None]] = defaultdict(dict)
        self.wakeups = 0  # streams woken by events, for tests and metrics

    def fire(self, tag: str) -> None:
        """Jobs became ready on ``tag``: hint it and wake one idle stream."""
        self._hinted[tag] = next(self._generation)
        self.pass_on(tag)

    def pass_on(self, tag: str) -> None:
        """Wakes the longest-idle stream that consumes ``tag``, if any."""
        waiters = self._idle.get(tag)
        if not waiters:
            return
        waiter = next(iter(waiters))
        waiters.pop(waiter)  # woken once; it registers again when it goes idle
        self.wakeups += 1
        waiter.wake_up(tag)

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

    def go_idle(self, waiter: Waiter, tags: Iterable[str]) -> bool:
        """Registers an idle stream; refuses (False) when one of its tags is hinted."""
        tags = list(tags)
        if any(t in self._hinted for t in tags):
            return False
        for tag in tags:
            self._idle[tag][waiter] = None
        return True

    def stop_idle(self, waiter: Waiter, tags: Iterable[str]) -> None:
        for tag in tags:
            waiters = self._idle.get(tag)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._idle[tag]
