"""Janitor: drops TTL-expired jobs and trims completed tombstones, every second.

A fixed tick is fine here: claim.lua refuses to deliver an expired job, so
this loop only frees memory and keeps counts honest.
"""

from __future__ import annotations

from collections.abc import Callable

from delayq_server.store import ShardKeys, Store
from delayq_server.store.store import EXPIRE_LIMIT
from delayq_server.timers.base import Loop

INTERVAL_S = 1.0


class Janitor(Loop):
    """One per server, sweeping every known shard."""

    name = "janitor"

    def __init__(self, store: Store, shards: Callable[[], list[ShardKeys]]) -> None:
        super().__init__()
        self._store, self._shards = store, shards

    async def tick(self) -> float | None:
        again = False
        for keys in self._shards():
            expired, _ = await self._store.expire(keys, EXPIRE_LIMIT)
            again = again or expired >= EXPIRE_LIMIT
        return 0 if again else INTERVAL_S
