"""Per-queue gauges read from Redis: jobs per state, backlog by due time, queue totals.

Observable instruments cannot await, so they report a snapshot that
``refresh`` fills. A refresh reads at most MAX_SHARDS shards (two pipelined or
scripted reads each, bounded; queues beyond take turns over the following
refreshes) and runs at most every REFRESH_S: before a
/metrics scrape when the snapshot is older, and in the background while a
push exporter (OTLP, console) is configured. Every replica reports the same
queue-wide values: aggregate them with max(), not sum() (docs/decisions.md,
"Metrics").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from delayq_server.store import BacklogDue, ShardKeys, Store
from delayq_server.tasks import cancel_and_wait
from delayq_server.telemetry import Telemetry

log = logging.getLogger(__name__)

REFRESH_S = 2.0
MAX_SHARDS = 256  # per refresh; more are read over the following refreshes, in turn
STATES = ("scheduled", "ready", "leased", "dead", "completed")
DUE = ("minute", "hour", "day", "later")


@dataclass(slots=True)
class QueueSnapshot:
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    due: BacklogDue = field(default_factory=BacklogDue)
    expired_total: int = 0
    dead_lettered_total: int = 0


class QueueGauges:
    """Snapshot of every known queue, and the observable instruments reading it."""

    def __init__(
        self,
        store: Store,
        telemetry: Telemetry,
        queues: Callable[[], Iterable[tuple[str, str, int]]],
        streams: Callable[[], int],
        leases: Callable[[], int],
    ) -> None:
        self._store, self._tel, self._queues = store, telemetry, queues
        self._streams, self._leases = streams, leases
        self.snapshot: dict[tuple[str, str], QueueSnapshot] = {}
        self._at = float("-inf")
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._next = 0  # index of the queue the next refresh starts with
        meter = metrics.get_meter("delayq.server")
        meter.create_observable_gauge(
            "delayq.queue.jobs", [self._jobs], "{job}", "Jobs per state (queue-wide, from Redis)"
        )
        meter.create_observable_gauge(
            "delayq.queue.backlog.due",
            [self._due],
            "{job}",
            "Backlog by when it falls due: within a minute, hour, day, or later",
        )
        meter.create_observable_counter(
            "delayq.queue.jobs.expired",
            [self._expired],
            "{job}",
            "Jobs dropped at their TTL (queue-wide total, from Redis)",
        )
        meter.create_observable_counter(
            "delayq.queue.jobs.dead_lettered",
            [self._dead_lettered],
            "{job}",
            "Jobs moved to the dead-letter set (queue-wide total, from Redis)",
        )
        meter.create_observable_up_down_counter(
            "delayq.consume.streams", [self._open_streams], "{stream}", "Open Consume streams"
        )
        meter.create_observable_up_down_counter(
            "delayq.leases.outstanding",
            [self._outstanding],
            "{lease}",
            "Deliveries of this replica's streams not yet answered",
        )

    # -- refresh --------------------------------------------------------------------

    async def maybe_refresh(self) -> None:
        """Refreshes when the snapshot is older than REFRESH_S; failures keep the old one."""
        if time.monotonic() - self._at < REFRESH_S:
            return
        async with self._lock:
            if time.monotonic() - self._at < REFRESH_S:
                return
            try:
                await self.refresh()
            except Exception as exc:
                log.warning("refreshing queue gauges: %s", exc)
            self._at = time.monotonic()

    async def refresh(self) -> None:
        """Reads up to MAX_SHARDS shards, continuing where the last refresh stopped:
        with more shards than that, every queue is still read in turn (each one
        every ceil(shards / MAX_SHARDS) refreshes) and keeps its last values."""
        queues = sorted(self._queues())
        known = {(ns, q) for ns, q, _ in queues}
        snapshot = {k: v for k, v in self.snapshot.items() if k in known}
        if not queues:
            self.snapshot = snapshot
            return
        start = self._next % len(queues)
        budget = MAX_SHARDS
        read = 0
        for ns, queue, shards in queues[start:] + queues[:start]:
            if read and shards > budget:
                break
            budget -= shards
            read += 1
            snapshot[(ns, queue)] = await self._read(ns, queue, shards)
        self._next = start + read
        self.snapshot = snapshot

    async def _read(self, ns: str, queue: str, shards: int) -> QueueSnapshot:
        snap = QueueSnapshot()
        for s in range(shards):
            keys = ShardKeys(ns, queue, s)
            st = await self._store.shard_stats(keys)
            snap.due += await self._store.backlog_due(keys)
            for state, value in zip(
                STATES, (st.scheduled, st.ready, st.leased, st.dead, st.completed), strict=True
            ):
                snap.states[state] += value
            snap.expired_total += st.counters.get("expired", 0)
            snap.dead_lettered_total += st.counters.get("dead_lettered", 0)
        return snap

    def start_background(self) -> None:
        """Keeps the snapshot fresh for push exporters (a scrape refreshes by itself)."""
        self._task = asyncio.create_task(self._forever(), name="queue-gauges")

    async def _forever(self) -> None:
        while True:
            await self.maybe_refresh()
            await asyncio.sleep(REFRESH_S)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    # -- callbacks (run by the SDK at collection) ------------------------------------

    def _jobs(self, _options: CallbackOptions) -> Iterable[Observation]:
        for (ns, queue), snap in list(self.snapshot.items()):
            attrs = self._tel.queue_attrs(ns, queue)
            for state, value in snap.states.items():
                yield Observation(value, {**attrs, "delayq.job.state": state})

    def _due(self, _options: CallbackOptions) -> Iterable[Observation]:
        for (ns, queue), snap in list(self.snapshot.items()):
            attrs = self._tel.queue_attrs(ns, queue)
            d = snap.due
            for name, value in zip(
                DUE, (d.within_minute, d.within_hour, d.within_day, d.later), strict=True
            ):
                yield Observation(value, {**attrs, "delayq.due_within": name})

    def _expired(self, _options: CallbackOptions) -> Iterable[Observation]:
        for (ns, queue), snap in list(self.snapshot.items()):
            yield Observation(snap.expired_total, self._tel.queue_attrs(ns, queue))

    def _dead_lettered(self, _options: CallbackOptions) -> Iterable[Observation]:
        for (ns, queue), snap in list(self.snapshot.items()):
            yield Observation(snap.dead_lettered_total, self._tel.queue_attrs(ns, queue))

    def _open_streams(self, _options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._streams())

    def _outstanding(self, _options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._leases())
