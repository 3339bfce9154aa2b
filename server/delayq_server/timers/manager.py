"""Keeps one promoter and one reaper per known shard, plus the janitor; each
shard's timers act only on the replica that owns the shard (ownership.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable

from delayq_server import events
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.timers.janitor import Janitor
from delayq_server.timers.ownership import Ownership
from delayq_server.timers.promoter import Promoter
from delayq_server.timers.reaper import Reaper

log = logging.getLogger(__name__)

REFRESH_S = 5.0  # how often queues created through other replicas are picked up


class Timers:
    """Every replica keeps loops for every known shard, but only the shard's owner
    lets them call Redis. Correctness never depends on that: scripts are
    conditional, ownership only keeps replicas from repeating each other's work."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        on_reaped: Callable[[ShardKeys, list[LeaseRef]], None],
        server_id: str = "",
    ) -> None:
        self._store, self._hub, self._on_reaped = store, hub, on_reaped
        self._loops: dict[ShardKeys, tuple[Promoter, Reaper]] = {}
        self._queues: set[tuple[str, str]] = set()
        self.ownership = Ownership(
            store, server_id or os.urandom(4).hex(), lambda: list(self._loops), self._gained
        )
        self._janitor = Janitor(store, lambda: self.ownership.owned)
        self._refresher: asyncio.Task[None] | None = None
        self._adopting: set[asyncio.Task[None]] = set()

    def _gained(self, keys: ShardKeys) -> None:
        """A shard became ours: its loops catch up at once."""
        loops = self._loops.get(keys)
        if loops is not None:
            for loop in loops:
                loop.wake.set()
        self._janitor.expect(keys, 0)

    def ensure(self, namespace: str, queue: str, shards: int) -> None:
        if (namespace, queue) in self._queues:
            return  # called on every enqueue: keep the common case a set lookup
        self._queues.add((namespace, queue))
        new = []
        for shard in range(shards):
            keys = ShardKeys(namespace, queue, shard)
            if keys not in self._loops:
                owns = self._owner_check(keys)
                promoter = Promoter(self._store, self._hub, keys, owns)
                reaper = Reaper(self._store, self._hub, keys, self._on_reaped, owns)
                promoter.start()
                reaper.start()
                self._loops[keys] = (promoter, reaper)
                new.append(keys)
        if new:
            task = asyncio.create_task(self._adopt(new), name=f"adopt {namespace}/{queue}")
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt(self, shards: list[ShardKeys]) -> None:
        try:
            await self.ownership.adopt(shards)
        except Exception as exc:  # the next renewal tries again
            log.warning("taking timers of new shards: %s", exc)

    def _owner_check(self, keys: ShardKeys) -> Callable[[], bool]:
        return lambda: self.ownership.holds(keys)

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
        await self.ownership.tick()  # take free shards before the loops first look
        self.ownership.start()
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
        await asyncio.gather(
            self._janitor.stop(), self.ownership.stop(), *(loop.stop() for loop in loops)
        )
        with contextlib.suppress(Exception):  # best effort: leases also run out alone
            await self.ownership.give_up()
        self._loops.clear()
        self._queues.clear()
