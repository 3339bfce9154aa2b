"""Keeps one promoter and one reaper per active shard, plus the janitor.

Loops of a queue with nothing scheduled, nothing leased and no Enqueue or
Consume here for IDLE_STOP_S stop (thousands of idle queues cost no tasks).
They start again on local activity, on a "due" event for the shard (another
replica scheduled a job), on a lease taken here, and, for events lost in a
pub/sub gap, when the periodic refresh finds backlog or leases in a stopped
shard (one pipelined read for all of them).

Every replica may run loops for a shard, but only the shard's owner lets them
call Redis (ownership.py): timer work is shared, not repeated. Correctness
never depends on that: scripts are conditional, ownership only keeps replicas
from repeating each other's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable

from delayq_server import events
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.tasks import cancel_and_wait
from delayq_server.timers.base import FALLBACK_S
from delayq_server.timers.janitor import Janitor
from delayq_server.timers.ownership import Ownership, preferred
from delayq_server.timers.promoter import COALESCE_S, Promoter, Waiters
from delayq_server.timers.reaper import Reaper

log = logging.getLogger(__name__)

REFRESH_S = 5.0  # how often queues created through other replicas are picked up
IDLE_STOP_S = 300.0  # an idle queue's loops stop after this long


class Timers:
    """Loops for every active shard; each acts only where its shard is owned."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        on_reaped: Callable[[ShardKeys, list[LeaseRef]], None],
        server_id: str = "",
        fallback_s: float = FALLBACK_S,
        *,
        idle_stop_s: float = IDLE_STOP_S,
        refresh_s: float = REFRESH_S,
        waiters: Waiters | None = None,
        coalesce_s: float = COALESCE_S,
    ) -> None:
        self._store, self._hub, self._on_reaped = store, hub, on_reaped
        self._fallback_s = fallback_s
        self._waiters = waiters  # this replica's idle streams (promoter.py)
        self._coalesce_s = coalesce_s
        self._idle_stop_s, self._refresh_s = idle_stop_s, refresh_s
        self._loops: dict[ShardKeys, tuple[Promoter, Reaper]] = {}
        self._queues: dict[tuple[str, str], int] = {}  # every known queue -> shard count
        self._active: dict[tuple[str, str], float] = {}  # queue -> monotonic last activity
        self.server_id = server_id or os.urandom(4).hex()
        # Ownership is taken for shards whose loops run: stopped (idle) shards
        # need no timers until activity, an event or the refresh restarts them.
        self.ownership = Ownership(store, self.server_id, lambda: list(self._loops), self._gained)
        self._janitor = Janitor(store, self._janitor_shards)
        self._refresher: asyncio.Task[None] | None = None
        self._adopting: set[asyncio.Task[None]] = set()
        # Told the shards of every queue this replica learns of (the pub/sub
        # listener subscribes to their channels: events.PubSubListener.want).
        self.on_known: Callable[[list[ShardKeys]], None] = lambda shards: None
        hub.on_unheard = self._unheard
        hub.listen(events.LEASE, self._lease_event)
        self._by_tag: dict[str, ShardKeys] = {}

    def _gained(self, keys: ShardKeys) -> None:
        """A shard became ours: its loops catch up at once."""
        loops = self._loops.get(keys)
        if loops is not None:
            for loop in loops:
                loop.wake.set()
        self._janitor.expect(keys, 0)

    def _janitor_shards(self) -> list[ShardKeys]:
        """Owned shards, and stopped ones this replica is preferred for (TTLs of
        ready jobs nobody consumes still run out; sweeps are idempotent)."""
        live = self.ownership.live
        return [
            k
            for k in self.known_shards()
            if self.ownership.holds(k)
            or (k not in self._loops and preferred(k, live) == self.server_id)
        ]

    def queues(self) -> list[tuple[str, str, int]]:
        """Every queue known here (namespace, queue, shard count)."""
        return [(ns, q, count) for (ns, q), count in list(self._queues.items())]

    def known_shards(self) -> list[ShardKeys]:
        return [
            ShardKeys(ns, q, shard)
            for (ns, q), count in self._queues.items()
            for shard in range(count)
        ]

    def running(self, keys: ShardKeys) -> bool:
        return keys in self._loops

    def ensure(self, namespace: str, queue: str, shards: int) -> None:
        """Enqueue or Consume touched the queue: its loops run (again)."""
        name = (namespace, queue)
        self._active[name] = time.monotonic()  # the hot path: a dict store and a lookup
        if name in self._queues and ShardKeys(namespace, queue, 0) in self._loops:
            return
        self._know(name, shards)
        self._start_queue(namespace, queue, shards)

    def _know(self, name: tuple[str, str], shards: int) -> None:
        if self._queues.get(name) != shards:
            self._queues[name] = shards
            self.on_known([ShardKeys(*name, s) for s in range(shards)])

    def _start_queue(self, namespace: str, queue: str, shards: int) -> None:
        new = [
            keys
            for keys in (ShardKeys(namespace, queue, s) for s in range(shards))
            if self._start(keys)
        ]
        if new:  # take ownership now, not at the next renewal
            task = asyncio.create_task(self._adopt(new), name=f"adopt {namespace}/{queue}")
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt(self, shards: list[ShardKeys]) -> None:
        try:
            await self.ownership.adopt(shards)
        except Exception as exc:  # the next renewal tries again
            log.warning("taking timers of new shards: %s", exc)

    def _start(self, keys: ShardKeys) -> bool:
        """Starts the shard's loops; False when they already run."""
        if keys in self._loops:
            return False
        owns = self._owner_check(keys)
        promoter = Promoter(self._store, self._hub, keys, owns, self._waiters, self._coalesce_s)
        reaper = Reaper(self._store, self._hub, keys, self._on_reaped, owns)
        promoter.fallback_s = reaper.fallback_s = self._fallback_s
        promoter.start()
        reaper.start()
        self._loops[keys] = (promoter, reaper)
        self._by_tag[keys.tag] = keys
        self._active.setdefault((keys.namespace, keys.queue), time.monotonic())
        return True

    def _owner_check(self, keys: ShardKeys) -> Callable[[], bool]:
        return lambda: self.ownership.holds(keys)

    def _unheard(self, kind: str, tag: str) -> None:
        """A wake-up no loop here listens to: a "due" for a stopped shard restarts it."""
        keys = _keys_of(tag) if kind == events.DUE else None
        if keys is None:
            return
        count = self._queues.get((keys.namespace, keys.queue))
        if count is not None and keys.shard < count:
            self._active[(keys.namespace, keys.queue)] = time.monotonic()
            self._start_queue(keys.namespace, keys.queue, count)

    def lease_taken(self, keys: ShardKeys, deadline_ms: int) -> None:
        """A stream on this replica leased jobs of ``keys`` until ``deadline_ms``."""
        loops = self._loops.get(keys)
        if loops is None:
            count = self._queues.get((keys.namespace, keys.queue))
            if count is None:
                return
            self._active[(keys.namespace, keys.queue)] = time.monotonic()
            self._start_queue(keys.namespace, keys.queue, count)
            loops = self._loops.get(keys)
            if loops is None:
                return
        loops[1].lease_taken(deadline_ms)

    def backlog_seen(self, keys: ShardKeys, next_due_ms: int | None, now_ms: int) -> None:
        """A claim here read the shard's next due time (Store.on_backlog_head)."""
        loops = self._loops.get(keys)
        if loops is not None:
            loops[0].report(next_due_ms, now_ms)

    def _lease_event(self, tag: str, detail: str) -> None:
        """claim.lua (through any replica) made a lease ending before the others."""
        keys = self._by_tag.get(tag)
        loops = self._loops.get(keys) if keys is not None else None
        if loops is not None:
            loops[1].lease_taken(int(detail) if detail.isdigit() else 0)

    def expect_expiry(self, keys: ShardKeys, in_ms: int) -> None:
        self._janitor.expect(keys, in_ms)

    def recheck(self, tag: str) -> None:
        """The shard's channel was (re)subscribed: events may have been lost, its
        running loops look again (a stopped one: the next refresh, REFRESH_S)."""
        keys = _keys_of(tag)
        for loop in self._loops.get(keys, ()) if keys else ():
            loop.wake.set()

    def sweep_soon(self, namespace: str, queue: str) -> None:
        """The queue's retention changed: the janitor sweeps its shards at once."""
        for s in range(self._queues.get((namespace, queue), 0)):
            self._janitor.expect(ShardKeys(namespace, queue, s), 0)

    def wake_all(self) -> None:
        """After a pub/sub gap (reconnect) wake-ups may have been lost: re-check everything.

        Stopped shards are re-checked by the next refresh (within REFRESH_S).
        """
        for promoter, reaper in self._loops.values():
            promoter.wake.set()
            reaper.wake.set()

    async def refresh(self) -> None:
        """Picks up new queues, stops idle loops, restarts stopped shards with work."""
        for ns, queue in await self._store.known_queues():
            if (ns, queue) in self._queues:
                continue
            shards = await self._store.shard_count(ns, queue, create=False)
            if shards:
                self._know((ns, queue), shards)
                self._start_queue(ns, queue, shards)
        await self._stop_idle()
        stopped = [k for k in self.known_shards() if k not in self._loops]
        if stopped:
            for keys, busy in zip(stopped, await self._store.has_work(stopped), strict=True):
                if busy:
                    name = (keys.namespace, keys.queue)
                    self._active[name] = time.monotonic()
                    self._start_queue(*name, self._queues[name])

    async def _stop_idle(self) -> None:
        now = time.monotonic()
        for (ns, queue), count in list(self._queues.items()):
            if now - self._active.get((ns, queue), now) < self._idle_stop_s:
                continue
            shards = [ShardKeys(ns, queue, s) for s in range(count)]
            loops = [self._loops[k] for k in shards if k in self._loops]
            if not loops or not all(p.idle and r.idle for p, r in loops):
                continue
            for keys in shards:
                pair = self._loops.pop(keys, None)
                if pair is not None:
                    await asyncio.gather(pair[0].stop(), pair[1].stop())
            log.debug("stopped the idle loops of %s/%s", ns, queue)

    async def forget_queue(self, namespace: str, queue: str) -> None:
        """The queue was deleted (DeleteQueue, here or on another replica): its
        loops stop and the janitor no longer sweeps it."""
        count = self._queues.pop((namespace, queue), 0)
        self._active.pop((namespace, queue), None)
        for s in range(count):
            pair = self._loops.pop(ShardKeys(namespace, queue, s), None)
            if pair is not None:
                await asyncio.gather(pair[0].stop(), pair[1].stop())

    async def start(self) -> None:
        await self.refresh()
        await self.ownership.tick()  # take free shards before the loops first look
        self.ownership.start()
        self._janitor.start()
        self._refresher = asyncio.create_task(self._refresh_forever(), name="timers-refresh")

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("timers refresh: %s", exc)

    async def stop(self) -> None:
        if self._refresher:
            await cancel_and_wait(self._refresher)
        loops = [loop for pair in self._loops.values() for loop in pair]
        await asyncio.gather(
            self._janitor.stop(), self.ownership.stop(), *(loop.stop() for loop in loops)
        )
        with contextlib.suppress(Exception):  # best effort: leases also run out alone
            await self.ownership.give_up()
        self._loops.clear()
        self._queues.clear()


def _keys_of(tag: str) -> ShardKeys | None:
    """'ns/queue/3' -> its ShardKeys (None for anything else)."""
    ns, _, rest = tag.partition("/")
    queue, _, shard = rest.rpartition("/")
    return ShardKeys(ns, queue, int(shard)) if queue and shard.isdigit() else None
