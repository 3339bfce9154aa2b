"""Per-namespace quotas: enqueue rate, stored jobs, queues and Consume streams (README "Quotas").

Each refusal is RESOURCE_EXHAUSTED with a message naming the quota and when
to retry; the same delay goes in the `retry-after-ms` trailer for programs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from delayq_server.errors import DelayqError
from delayq_server.store.quotas import QuotaStore, Taken

log = logging.getLogger(__name__)

# A namespace's stored-job count is re-read at most this often per replica;
# the overshoot is bounded by the enqueue rate quota times this.
BACKLOG_CACHE_S = 1.0
# Enqueue tokens are taken from the shared bucket in chunks and spent locally, so a
# unary Enqueue makes one Redis call, not two (issue 12). A chunk is at most a
# twentieth of the burst and 50 ms of rate; unspent tokens lapse after
# ALLOWANCE_TTL_S. Tokens are only ever taken from the shared bucket, never made
# up locally: the namespace's rate holds over all replicas; a replica may use
# tokens up to ALLOWANCE_TTL_S after taking them.
ALLOWANCE_TTL_S = 1.0
ALLOWANCE_BURST_SHARE = 20
ALLOWANCE_RATE_S = 0.05
_TAKEN = Taken(True, 0)
# A Consume stream's slot lives this long unless renewed; a crashed replica's
# slots free themselves after it.
STREAM_SLOT_TTL_MS = 30_000


class QuotaExceeded(DelayqError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


@dataclass(frozen=True, slots=True)
class Limits:
    """Quotas per namespace; 0 turns one off."""

    enqueue_rate: float = 0.0  # jobs per second
    enqueue_burst: int = 0  # bucket size; 0: one second of rate
    max_jobs: int = 0  # stored jobs (scheduled + ready + leased + dead)
    max_queues: int = 0
    max_streams: int = 0  # concurrent Consume streams, over every replica


class _Refill(asyncio.Event):
    """A call to the shared bucket under way for a namespace; set when it returned.
    Its refusal answers waiters needing as many tokens or more."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.refused: Taken | None = None


class Quotas:
    def __init__(self, store: QuotaStore, limits: Limits, server_id: str) -> None:
        self._store = store
        self.limits = limits
        self._server_id = server_id
        self._jobs: dict[str, tuple[float, int]] = {}  # ns -> (read at, count)
        self._allowance: dict[str, tuple[float, int]] = {}  # ns -> (taken at, tokens left)
        self._refills: dict[str, _Refill] = {}  # ns -> the bucket call under way

    async def enqueue(self, namespace: str, n: int) -> None:
        """Admits n new jobs into a namespace or raises QuotaExceeded (nothing taken)."""
        lim = self.limits
        if lim.max_jobs:
            now = time.monotonic()
            cached = self._jobs.get(namespace)
            if cached is None or now - cached[0] > BACKLOG_CACHE_S:
                cached = (now, await self._store.namespace_jobs(namespace))
                self._jobs[namespace] = cached
            if cached[1] + n > lim.max_jobs:
                raise QuotaExceeded(
                    f"quota: namespace {namespace!r} stores {cached[1]} jobs, the most is "
                    f"{lim.max_jobs}: ack, delete or purge jobs; retry in 1 s",
                    1000,
                )
        if lim.enqueue_rate > 0:
            burst = lim.enqueue_burst or max(1, int(lim.enqueue_rate))
            taken = await self._take(namespace, n, burst)
            if not taken.ok and taken.retry_after_ms < 0:
                raise QuotaExceeded(
                    f"quota: {n} jobs at once exceed namespace {namespace!r}'s enqueue burst "
                    f"of {burst}: send smaller batches",
                    1000,
                )
            if not taken.ok:
                raise QuotaExceeded(
                    f"quota: namespace {namespace!r} enqueue rate of {lim.enqueue_rate:g} "
                    f"jobs/s exceeded; retry in {taken.retry_after_ms / 1000:.3f} s",
                    taken.retry_after_ms,
                )
            if lim.max_jobs:
                ts, count = self._jobs[namespace]
                self._jobs[namespace] = (ts, count + n)

    async def _take(self, namespace: str, n: int, burst: int) -> Taken:
        """Spends n tokens of this replica's allowance; when short, one script call
        takes n plus as much of a chunk as the shared bucket holds.

        Calls that find the allowance short while a refill is under way wait for it
        and spend from it: each taking its own chunk, 50 concurrent callers asked the
        bucket for 50 chunks at once and drained it far below the rate (issue 12)."""
        while True:
            now = time.monotonic()
            taken_at, left = self._allowance.get(namespace, (0.0, 0))
            if now - taken_at > ALLOWANCE_TTL_S:
                left = 0
            if left >= n:
                self._allowance[namespace] = (taken_at, left - n)
                return _TAKEN
            refill = self._refills.get(namespace)
            if refill is None:
                break
            await refill.wait()  # then look again: it may not cover us
            if refill.refused is not None and n >= refill.n:
                return refill.refused  # the bucket lacked fewer tokens than we need
        self._refills[namespace] = refill = _Refill(n)
        try:
            rate = self.limits.enqueue_rate
            chunk = min(burst // ALLOWANCE_BURST_SHARE, int(rate * ALLOWANCE_RATE_S))
            got = await self._store.take_enqueue(namespace, n, rate, burst, up_to=n + chunk)
            if got.ok:
                self._allowance[namespace] = (now, got.taken - n)
            else:
                refill.refused = got
            return got
        finally:
            del self._refills[namespace]
            refill.set()

    async def enqueue_many(self, namespaces: list[str]) -> dict[str, QuotaExceeded]:
        """Admits a batch's jobs per namespace; the refusal of each namespace refused."""
        refused: dict[str, QuotaExceeded] = {}
        for ns, n in collections.Counter(namespaces).items():  # counted in C
            try:
                await self.enqueue(ns, n)
            except QuotaExceeded as exc:
                refused[ns] = exc
        return refused

    async def queue(self, namespace: str, queue: str) -> None:
        """Counts a queue about to be used; a new one beyond the quota is refused.

        Queues come into being on first Enqueue or Consume, up to the quota.
        """
        most = self.limits.max_queues
        if await self._store.queue_exists(namespace, queue):
            most = 0  # existing (or pre-quota) queues are only recorded
        if not await self._store.admit_queue(namespace, queue, most):
            raise QuotaExceeded(
                f"quota: namespace {namespace!r} has its maximum of {most} queues; "
                f"queue {queue!r} is not created: use an existing queue",
                60_000,
            )

    @contextlib.asynccontextmanager
    async def stream(self, namespace: str) -> AsyncIterator[None]:
        """Holds one Consume stream slot of the namespace while the block runs."""
        most = self.limits.max_streams
        if not most:
            yield
            return
        stream_id = f"{self._server_id}/{os.urandom(6).hex()}"
        if not await self._store.hold_stream(namespace, stream_id, most, STREAM_SLOT_TTL_MS):
            raise QuotaExceeded(
                f"quota: namespace {namespace!r} has its maximum of {most} Consume streams "
                "open; close one or retry in 5 s",
                5_000,
            )
        renew = asyncio.create_task(self._renew(namespace, stream_id, most))
        try:
            yield
        finally:
            renew.cancel()
            with contextlib.suppress(Exception):
                await self._store.drop_stream(namespace, stream_id)

    async def _renew(self, namespace: str, stream_id: str, most: int) -> None:
        while True:
            await asyncio.sleep(STREAM_SLOT_TTL_MS / 3000)
            try:
                await self._store.hold_stream(namespace, stream_id, most, STREAM_SLOT_TTL_MS)
            except Exception as exc:  # Redis blip: the next renewal tries again
                log.warning("renewing a Consume stream slot failed: %s", exc)
