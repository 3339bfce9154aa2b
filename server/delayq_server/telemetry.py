"""OpenTelemetry instruments and trace hand-offs of the server (README "Observability").

Providers come from otel_providers.py (OTEL_* environment, ``--otel``,
``--http-listen``). Trace context crosses the queue in the job's headers
(``traceparent``/``tracestate``): Enqueue stores the context of its server span
(a child of the producer's), and each delivery gets a span whose parent is
that context and which links to it with the lateness as a link attribute, so
the producer's trace continues in the consumer.

Names follow the OpenTelemetry messaging conventions: ``messaging.system`` is
``delayq`` and ``messaging.destination.name`` the queue; job ids are never
attributes (bounded cardinality). Counters count what this process did; the
``delayq.queue.*`` instruments are read from Redis (queue_gauges.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from opentelemetry import metrics, propagate, trace

from delayq_server import clock, ids, otel_providers
from delayq_server.store import Claimed, LeaseRef, ShardKeys

TRACE_HEADERS = ("traceparent", "tracestate")
MAX_ATTRIBUTE_SETS = 10_000  # cached attribute dicts (queues); cleared beyond this

Attrs = Mapping[str, str]


class Telemetry:
    """The server's instruments; no-ops unless providers were installed."""

    def __init__(self, providers: otel_providers.Providers | None = None) -> None:
        self.providers = providers or otel_providers.Providers()
        self.tracing = self.providers.tracer is not None
        self.metering = self.providers.meter is not None
        self.enabled = self.tracing or self.metering  # gates per-call work in servicers
        self._tracer = trace.get_tracer("delayq.server")
        meter = metrics.get_meter("delayq.server")
        job = "{job}"
        self.enqueued = meter.create_counter("delayq.jobs.enqueued", job, "Jobs stored")
        self.delivered = meter.create_counter(
            "delayq.jobs.delivered", job, "Deliveries written to Consume streams"
        )
        self.acked = meter.create_counter("delayq.jobs.acked", job, "Jobs acked")
        self.nacked = meter.create_counter(
            "delayq.jobs.nacked", job, "Nacks, by outcome (retry or dead)"
        )
        self.released = meter.create_counter(
            "delayq.jobs.released", job, "Leases given back (Release, or a closed stream)"
        )
        self.leases_expired = meter.create_counter(
            "delayq.leases.expired", "{lease}", "Leases that ran out (reaped by this replica)"
        )
        self.lateness = meter.create_histogram(
            "delayq.delivery.lateness",
            "s",
            "Time from a job's due time to its delivery being written to a stream",
        )
        self.to_ack = meter.create_histogram(
            "delayq.job.enqueue_to_ack", "s", "Time from enqueue to ack"
        )
        self.script_duration = meter.create_histogram(
            "delayq.redis.script.duration", "s", "Redis Lua script calls, by script"
        )
        self._attrs: dict[tuple[str, str], Attrs] = {}
        self._script_attrs: dict[str, Attrs] = {}

    def queue_attrs(self, namespace: str, queue: str) -> Attrs:
        key = (namespace, queue)
        attrs = self._attrs.get(key)
        if attrs is None:
            if len(self._attrs) >= MAX_ATTRIBUTE_SETS:
                self._attrs.clear()
            attrs = self._attrs[key] = {
                "messaging.system": "delayq",
                "messaging.destination.name": queue,
                "delayq.namespace": namespace,
            }
        return attrs

    def _of(self, keys: ShardKeys) -> Attrs:
        return self.queue_attrs(keys.namespace, keys.queue)

    # -- traces ---------------------------------------------------------------------

    def trace_headers(self, context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
        """Trace context to store with enqueued jobs: the current span's, else the caller's."""
        carrier: dict[str, str] = {}
        if self.tracing:
            propagate.inject(carrier)
        if "traceparent" not in carrier:
            metadata = context.invocation_metadata() or ()
            for key, value in metadata:
                if key in TRACE_HEADERS and isinstance(value, str):
                    carrier[key] = value
        return carrier

    # -- recording ------------------------------------------------------------------

    def on_enqueued(self, keys: ShardKeys, stored: int) -> None:
        if stored:
            self.enqueued.add(stored, self._of(keys))

    def on_delivered(self, batch: Sequence[tuple[ShardKeys, Claimed]], waited_s: float) -> None:
        """A batch about to be written to its stream, claimed ``waited_s`` ago:
        counts, lateness (claim lateness on the Redis clock plus the wait), and
        a delivery span per job in the producer's trace."""
        for keys, n in Counter(keys for keys, _ in batch).items():
            self.delivered.add(n, self._of(keys))
        for keys, c in batch:
            rec = c.record
            lateness = max(0.0, (rec.last_delivery_ms - rec.due_ms) / 1000 + waited_s)
            self.lateness.record(lateness, self._of(keys))
            if not self.tracing:
                continue
            carrier = {k: rec.headers[k] for k in TRACE_HEADERS if k in rec.headers}
            parent = propagate.extract(carrier)
            producer = trace.get_current_span(parent).get_span_context()
            links = []
            if producer.is_valid:
                links.append(trace.Link(producer, {"delayq.lateness_ms": lateness * 1000}))
            span = self._tracer.start_span(
                f"{keys.queue} deliver",
                context=parent,
                kind=trace.SpanKind.PRODUCER,
                links=links,
                attributes={
                    "messaging.system": "delayq",
                    "messaging.operation.type": "send",
                    "messaging.operation.name": "deliver",
                    "messaging.destination.name": keys.queue,
                    "messaging.message.id": c.job_id,
                    "delayq.namespace": keys.namespace,
                    "delayq.attempt": rec.attempts,
                    "delayq.lateness_ms": lateness * 1000,
                },
            )
            span.end()

    def on_acked(self, acked: Sequence[tuple[ShardKeys, str]]) -> None:
        """Acked (keys, job id) pairs: counts and time since enqueue (the id's clock)."""
        now_ms = clock.wall_ns() // 1_000_000
        for keys, n in Counter(keys for keys, _ in acked).items():
            self.acked.add(n, self._of(keys))
        for keys, job_id in acked:
            created = ids.created_ms(job_id)
            if created is not None:
                self.to_ack.record(max(0.0, (now_ms - created) / 1000), self._of(keys))

    def on_nacked(self, keys: ShardKeys, dead: bool) -> None:
        attrs = {**self._of(keys), "delayq.nack.outcome": "dead" if dead else "retry"}
        self.nacked.add(1, attrs)

    def on_released(self, keys: ShardKeys, n: int) -> None:
        if n:
            self.released.add(n, self._of(keys))

    def on_reaped(self, keys: ShardKeys, leases: Sequence[LeaseRef]) -> None:
        if leases:
            self.leases_expired.add(len(leases), self._of(keys))

    def observe_script(self, name: str, started: float) -> None:
        """Store._run's hook: one script call that started at ``started`` (perf_counter)."""
        attrs = self._script_attrs.get(name)
        if attrs is None:
            attrs = self._script_attrs[name] = {"delayq.script": name}
        self.script_duration.record(time.perf_counter() - started, attrs)

    # -- wiring ---------------------------------------------------------------------

    def interceptors(self) -> Sequence[Any]:
        if not self.tracing:
            return ()
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        return (aio_server_interceptor(),)  # type: ignore[no-untyped-call]

    def shutdown(self) -> None:
        self.providers.shutdown()


def setup(otel: bool, http: bool, resource: Mapping[str, str] | None = None) -> Telemetry:
    """Installs the providers the flags and OTEL_* environment ask for."""
    providers = otel_providers.install(otel_providers.plan(otel, http), resource)
    return Telemetry(providers)
