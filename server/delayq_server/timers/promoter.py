"""Promoter: sleeps until a shard's next due time, then moves due jobs to ready."""

from __future__ import annotations

from collections.abc import Callable

from delayq_server import events
from delayq_server.store import ShardKeys, Store
from delayq_server.store.store import PROMOTE_LIMIT
from delayq_server.timers.base import Loop


class Promoter(Loop):
    """One per shard. Woken early by "due" events (an earlier job arrived)."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        keys: ShardKeys,
        owns: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__()
        self.name = f"promoter {keys.tag}"
        self._store, self._hub, self._keys, self._owns = store, hub, keys, owns
        hub.subscribe(events.DUE, keys.tag, self.wake)

    async def tick(self) -> float | None:
        if not self._owns():
            self.idle = True  # nothing for this replica to do here
            return None  # another replica promotes; woken again when we own the shard
        res = await self._store.promote(self._keys, PROMOTE_LIMIT)
        self.idle = res.next_due_ms is None
        # promote.lua publishes the "ready" wake-up for every replica, this one too.
        if res.moved >= PROMOTE_LIMIT:
            return 0  # more are due: go again at once (each call is bounded)
        if res.next_due_ms is None:
            return None
        # Relative to Redis' clock as the script saw it, so local skew never
        # makes us promote early (the script re-checks against TIME anyway).
        return max(0.0, (res.next_due_ms - res.now_ms) / 1000)

    async def stop(self) -> None:
        self._hub.unsubscribe(events.DUE, self._keys.tag, self.wake)
        await super().stop()
