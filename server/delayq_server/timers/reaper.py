"""Reaper: returns expired leases to the backlog (backoff) or the dead set."""

from __future__ import annotations

from collections.abc import Callable

from delayq_server import events
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.timers.base import Loop


class Reaper(Loop):
    """One per shard; sleeps until the earliest lease deadline, woken by new leases."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        keys: ShardKeys,
        on_reaped: Callable[[ShardKeys, list[LeaseRef]], None],
    ) -> None:
        super().__init__()
        self.name = f"reaper {keys.tag}"
        self._store, self._hub, self._keys, self._on_reaped = store, hub, keys, on_reaped
        hub.subscribe(events.LEASE, keys.tag, self.wake)

    async def tick(self) -> float | None:
        res = await self._store.reap(self._keys)
        if res.reaped:
            self._on_reaped(self._keys, res.reaped)
            self._hub.fire(events.DUE, self._keys.tag)
            self._hub.fire(events.READY, self._keys.tag)
            if res.more:
                return 0
        if res.next_deadline_ms is None:
            return None
        return max(0.0, (res.next_deadline_ms - res.now_ms) / 1000)

    async def stop(self) -> None:
        self._hub.unsubscribe(events.LEASE, self._keys.tag, self.wake)
        await super().stop()
