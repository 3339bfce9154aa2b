"""The backlog of one shard by due time: next minute, hour, day, later (lua/backlog.lua)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from delayq_server.store.keys import ShardKeys

BUCKETS_PER_CALL = 1000  # each call stays well under a millisecond of Redis time


@dataclass(frozen=True, slots=True)
class BacklogDue:
    """Scheduled jobs by when they fall due, from ``now_ms`` (Redis clock)."""

    within_minute: int = 0
    within_hour: int = 0
    within_day: int = 0
    later: int = 0
    now_ms: int = 0

    def __add__(self, other: BacklogDue) -> BacklogDue:
        return BacklogDue(
            self.within_minute + other.within_minute,
            self.within_hour + other.within_hour,
            self.within_day + other.within_day,
            self.later + other.later,
            max(self.now_ms, other.now_ms),
        )


Run = Callable[[str, Sequence[str], Sequence[Any]], Awaitable[Any]]


async def backlog_due(
    run: Run, keys: ShardKeys, width_ms: int, now_ms: int | None = None
) -> BacklogDue:
    """Counts with one bounded script call per BUCKETS_PER_CALL buckets due within a day.

    The work grows with the number of non-empty buckets due within the next
    day (86,400 at most with the default 1 s width), never with the jobs in them.
    """
    now = "" if now_ms is None else str(now_ms)
    cursor = ""
    counts = [0, 0, 0]
    backlog = 0
    clock = 0
    while True:
        out = await run(
            "backlog",
            [keys.index, keys.stats],
            [keys.prefix, now, width_ms, cursor, BUCKETS_PER_CALL],
        )
        clock, backlog = int(out[0]), int(out[1])
        now = str(clock)  # later calls count against the same boundaries
        for i in range(3):
            counts[i] += int(out[2 + i])
        if int(out[5]) < 0:
            break
        cursor = str(int(out[5]))
    later = max(0, backlog - sum(counts))
    return BacklogDue(counts[0], counts[1], counts[2], later, clock)
