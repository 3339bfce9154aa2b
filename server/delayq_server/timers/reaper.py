"""Reaper: returns expired leases to the backlog (backoff) or the dead set."""

from __future__ import annotations

import logging
from collections.abc import Callable

from delayq_server import events, logs
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.timers.base import Loop

log = logging.getLogger(__name__)


class Reaper(Loop):
    """One per shard; sleeps until the earliest lease deadline.

    New leases wake it only when they end before its planned wake-up, so a
    busy stream's claims do not each cost a reap call.
    """

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        keys: ShardKeys,
        on_reaped: Callable[[ShardKeys, list[LeaseRef]], None],
        owns: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__()
        self.name = f"reaper {keys.tag}"
        self._store, self._hub, self._keys = store, hub, keys
        self._on_reaped, self._owns = on_reaped, owns
        self._wake_at_ms: int | None = None  # Redis-clock ms of the planned re-check
        # claim.lua announces a lease ending before every other lease of the
        # shard, so the owner re-plans even for leases taken through another
        # replica: Timers routes those "lease" events to lease_taken, which wakes
        # the loop only for a deadline before its planned re-check (waking for
        # every claim's event cost a reap call per claim, issue 12).

    def lease_taken(self, deadline_ms: int) -> None:
        if self._wake_at_ms is None or deadline_ms < self._wake_at_ms:
            self._wake_at_ms = deadline_ms
            self.wake.set()

    async def tick(self) -> float | None:
        if not self._owns():
            self.idle = True  # nothing for this replica to do here
            return None  # another replica reaps; woken again when we own the shard
        res = await self._store.reap(self._keys)
        # reap.lua publishes the "ready"/"due" wake-ups for retried jobs.
        if res.reaped:
            self._log(res.reaped, res.dead)
            self._on_reaped(self._keys, res.reaped)
        self._wake_at_ms = res.next_deadline_ms
        self.idle = res.next_deadline_ms is None and not res.more
        if res.more:
            return 0
        if res.next_deadline_ms is None:
            return None
        return max(0.0, (res.next_deadline_ms - res.now_ms) / 1000)

    def _log(self, reaped: list[LeaseRef], dead: frozenset[str]) -> None:
        k = self._keys
        for lease in reaped:
            logs.event(
                log, "lease_expired", "lease expired", namespace=k.namespace, queue=k.queue,
                job_id=lease.job_id,
            )  # fmt: skip
            if lease.job_id in dead:
                logs.event(
                    log, "dead_lettered", "job dead-lettered", namespace=k.namespace,
                    queue=k.queue, job_id=lease.job_id,
                    reason="lease expired on the final attempt",
                )  # fmt: skip
