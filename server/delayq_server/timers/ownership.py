"""Ownership: which shards' promoter, reaper and janitor sweep run on this replica.

Each shard's timers run on one replica at a time, under a short ownership
lease in Redis (own.lua) that the owner renews every second. When the owner
dies, its leases run out and another replica takes the shard within about
LEASE_MS + RENEW_S. A paused owner stops acting on its own: it trusts its lease
only until its local monotonic clock, started before the renewal call, says
the Redis lease could have run out (minus a margin), and a pause does not stop
that clock. A call already under way when the lease runs out can still land;
that is harmless because every timer script is conditional and idempotent
(docs/decisions.md, timer ownership).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable

from delayq_server.store import ShardKeys, Store
from delayq_server.timers.base import Loop

log = logging.getLogger(__name__)

LEASE_MS = 3_000
RENEW_S = 1.0
MARGIN_S = 0.5  # stop trusting the lease this long before it could run out


def preferred(keys: ShardKeys, replicas: list[str]) -> str:
    """Rendezvous hashing: every replica computes the same owner for a shard from
    the same live set, shards spread evenly, and a replica joining or leaving
    moves only the shards it gains or held."""
    return max(replicas, key=lambda r: hashlib.blake2b(f"{keys.tag}|{r}".encode()).digest())


class Ownership(Loop):
    """Takes and renews, once a second, the ownership leases of the shards this
    replica is preferred for among the live ones (a heartbeat set in Redis)."""

    name = "ownership"

    def __init__(
        self,
        store: Store,
        server_id: str,
        shards: Callable[[], list[ShardKeys]],
        on_gained: Callable[[ShardKeys], None],
    ) -> None:
        super().__init__()
        self._store, self._server_id = store, server_id
        self._shards, self._on_gained = shards, on_gained
        self._until: dict[ShardKeys, float] = {}  # monotonic time the lease is trusted until
        self._live: list[str] = [server_id]  # live replicas at the last heartbeat

    def holds(self, keys: ShardKeys) -> bool:
        return time.monotonic() < self._until.get(keys, 0.0)

    @property
    def owned(self) -> list[ShardKeys]:
        return [k for k in self._until if self.holds(k)]

    @property
    def live(self) -> list[str]:
        """Live replicas as of the last heartbeat (this one at least)."""
        return self._live

    async def tick(self) -> float | None:
        started = time.monotonic()  # before the calls: the Redis lease starts later
        live = await self._store.heartbeat(self._server_id, LEASE_MS) or [self._server_id]
        self._live = live
        mine: list[ShardKeys] = []
        theirs: list[ShardKeys] = []
        shards = self._shards()
        for keys in shards:
            (mine if preferred(keys, live) == self._server_id else theirs).append(keys)
        # Shards whose loops stopped (idle) need no owner: let their leases go.
        running = set(shards)
        theirs += [k for k in self._until if k not in running]
        # A shard another live replica prefers is handed over: given up, so the
        # preferred one takes it on its next renewal instead of after a lease.
        handed = [k for k in theirs if k in self._until]
        if handed:
            await self._store.own(handed, self._server_id, LEASE_MS, give_up=True)
            for keys in handed:
                del self._until[keys]
            log.info("handed %d shards' timers to other replicas", len(handed))
        await self._take(mine, started)
        return RENEW_S

    async def adopt(self, shards: list[ShardKeys]) -> None:
        """New shards (a queue just created here): take those we are preferred
        for now, so their first jobs do not wait for the next renewal."""
        started = time.monotonic()
        await self._take(
            [k for k in shards if preferred(k, self._live) == self._server_id], started
        )

    async def _take(self, shards: list[ShardKeys], started: float) -> None:
        held = await self._store.own(shards, self._server_id, LEASE_MS)
        trusted_until = started + LEASE_MS / 1000 - MARGIN_S
        for keys, ok in zip(shards, held, strict=True):
            had = self.holds(keys)
            if ok:
                self._until[keys] = trusted_until
                if not had:
                    log.info("timers of %s now run on this replica", keys.tag)
                    self._on_gained(keys)
            elif self._until.pop(keys, None) is not None and had:
                log.info("timers of %s moved to another replica", keys.tag)

    async def give_up(self) -> None:
        """On shutdown: lets another replica take our shards at once."""
        owned = list(self._until)
        self._until.clear()
        await self._store.heartbeat(self._server_id, LEASE_MS, leaving=True)
        await self._store.own(owned, self._server_id, LEASE_MS, give_up=True)
