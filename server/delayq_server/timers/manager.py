"""Keeps one promoter and one reaper per known shard, plus the janitor."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from delayq_server import events
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.timers.base import FALLBACK_S
from delayq_server.timers.janitor import Janitor
from delayq_server.timers.promoter import Promoter
from delayq_server.timers.reaper import Reaper

log = logging.getLogger(__name__)

REFRESH_S = 5.0  # how often queues created through other replicas are picked up


class Timers:
    """Correctness never depends on these being the only ones: scripts are
    conditional, so every replica runs them for every shard."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        on_reaped: Callable[[ShardKeys, list[LeaseRef]], None],
        fallback_s: float = FALLBACK_S,
    ) -> None:
        self._store, self._hub, self._on_reaped = store, hub, on_reaped
        self._fallback_s = fallback_s
        self._loops: dict[ShardKeys, tuple[Promoter, Reaper]] = {}
        self._queues: set[tuple[str, str]] = set()
        self._janitor = Janitor(store, lambda: list(self._loops))
        self._refresher: asyncio.Task[None] | None = None

    def ensure(self, namespace: str, queue: str, shards: int) -> None:
        if (namespace, queue) in self._queues:
            return  # called on every enqueue: keep the common case a set lookup
        self._queues.add((namespace, queue))
        for shard in range(shards):
            keys = ShardKeys(namespace, queue, shard)
            if keys not in self._loops:
                promoter = Promoter(self._store, self._hub, keys)
                reaper = Reaper(self._store, keys, self._on_reaped)
                promoter.fallback_s = reaper.fallback_s = self._fallback_s
                promoter.start()
                reaper.start()
                self._loops[keys] = (promoter, reaper)

    def lease_taken(self, keys: ShardKeys, deadline_ms: int) -> None:
        """A stream on this replica leased jobs of ``keys`` until ``deadline_ms``."""
        loops = self._loops.get(keys)
        if loops is not None:
            loops[1].lease_taken(deadline_ms)

    def expect_expiry(self, keys: ShardKeys, in_ms: int) -> None:
        self._janitor.expect(keys, in_ms)

    def wake_all(self) -> None:
        """After a pub/sub gap (reconnect) wake-ups may have been lost: re-check everything."""
        for promoter, reaper in self._loops.values():
            promoter.wake.set()
            reaper.wake.set()

    async def refresh(self) -> None:
        for ns, queue in await self._store.known_queues():
            shards = await self._store.shard_count(ns, queue, create=False)
            if shards:
                self.ensure(ns, queue, shards)

    async def start(self) -> None:
        await self.refresh()
        self._janitor.start()
        self._refresher = asyncio.create_task(self._refresh_forever(), name="timers-refresh")

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("timers refresh: %s", exc)

    async def stop(self) -> None:
        if self._refresher:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        loops = [loop for pair in self._loops.values() for loop in pair]
        await asyncio.gather(self._janitor.stop(), *(loop.stop() for loop in loops))
        self._loops.clear()
        self._queues.clear()
