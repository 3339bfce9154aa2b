"""Janitor: drops TTL-expired jobs, trims completed tombstones, and keeps dead
letters within their queue's retention (age, count; issue 14).

It sweeps a shard only when the shard's next expiry or trim falls due (each
sweep reports the next one), and every shard at least every RESWEEP_S for
jobs that other replicas added. claim.lua refuses to deliver an expired job,
so this loop only frees memory and keeps counts honest.

A shard whose sweep fails is skipped with its own growing back-off while the
rest of the sweep goes on, and each sweep starts one shard further along, so
no shard is always first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from delayq_server.store import ShardKeys, Store
from delayq_server.store.jobs_admin import JobAdmin
from delayq_server.timers.base import Loop

log = logging.getLogger(__name__)

INTERVAL_S = 0.25  # granularity of sweeps that are due
RESWEEP_S = 30.0
FAIL_BACKOFF_S = 0.5  # first retry of a failing shard; doubles up to RESWEEP_S
RETAIN_CALLS = 20  # retain.lua calls per shard per sweep (200 jobs each); then again at once


class Janitor(Loop):
    """One per server, sweeping every known shard when it needs it."""

    name = "janitor"

    def __init__(self, store: Store, shards: Callable[[], list[ShardKeys]]) -> None:
        super().__init__()
        self._store, self._shards = store, shards
        self._jobs = JobAdmin(store)
        self._due: dict[ShardKeys, float] = {}  # shard -> monotonic time of next sweep
        self._failures: dict[ShardKeys, int] = {}  # shard -> consecutive failed sweeps
        self._start = 0  # rotates the first shard of each sweep

    def expect(self, keys: ShardKeys, in_ms: int) -> None:
        """A job with a TTL was added here: sweep no later than its expiry."""
        at = time.monotonic() + in_ms / 1000
        if at < self._due.get(keys, float("inf")):
            self._due[keys] = at

    async def tick(self) -> float | None:
        now = time.monotonic()
        shards = self._shards()
        if shards:
            self._start = (self._start + 1) % len(shards)
            shards = shards[self._start :] + shards[: self._start]
        for keys in shards:
            if self._due.get(keys, 0.0) > now:
                continue
            try:
                res = await self._store.expire(keys)
                behind, retain_in = await self._retain(keys)
            except Exception as exc:
                failures = self._failures.get(keys, 0) + 1
                self._failures[keys] = failures
                wait = min(RESWEEP_S, FAIL_BACKOFF_S * 2 ** (failures - 1))
                self._due[keys] = now + wait
                log.warning("janitor: shard %s failed (%s); retry in %.1fs", keys.tag, exc, wait)
                continue
            self._failures.pop(keys, None)
            wait = RESWEEP_S
            if res.next_ms is not None:
                wait = min(wait, max(0.0, (res.next_ms - res.now_ms) / 1000))
            if retain_in is not None:  # the oldest dead job ages out then
                wait = min(wait, retain_in / 1000)
            self._due[keys] = now if behind else now + wait
        return INTERVAL_S

    async def _retain(self, keys: ShardKeys) -> tuple[bool, int | None]:
        """Deletes dead jobs past the queue's retention, in bounded calls. Returns
        whether more are left for the next pass, and the ms until the oldest dead
        job ages out (None: no age bound or no dead job)."""
        settings = await self._store.queues.settings(keys.namespace, keys.queue)
        if settings is None or not (settings.dead_retention_ms or settings.dead_max_jobs):
            return False, None
        per_shard = 0
        if settings.dead_max_jobs:  # the count is the queue's: each shard keeps its share
            per_shard = -(-settings.dead_max_jobs // max(1, settings.shards))
        for _ in range(RETAIN_CALLS):
            _, more, next_in = await self._jobs.retain(keys, settings.dead_retention_ms, per_shard)
            if not more:
                return False, next_in
        return True, None
