"""OpenTelemetry: traces and metrics over OTLP when enabled (``--otel``).

Exporters read the standard environment (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_SERVICE_NAME``, ...). Trace context crosses the queue in the job's
headers (``traceparent``/``tracestate``): Enqueue stores the context of its
server span (a child of the producer's), and each delivery gets a span whose
parent is that context, so the producer's trace continues in the consumer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry import metrics, propagate, trace

from delayq_server.store import Claimed, ShardKeys

TRACE_HEADERS = ("traceparent", "tracestate")


class Telemetry:
    """The server's instruments; no-ops unless ``setup`` installed SDK providers."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._tracer = trace.get_tracer("delayq.server")
        meter = metrics.get_meter("delayq.server")
        self.enqueued = meter.create_counter("delayq.jobs.enqueued", "{job}", "Jobs stored")
        self.delivered = meter.create_counter("delayq.jobs.delivered", "{job}", "Leases handed out")
        self.acked = meter.create_counter("delayq.jobs.acked", "{job}", "Ack results by outcome")
        self.lateness = meter.create_histogram(
            "delayq.delivery.lateness", "ms", "Claim time minus due time (Redis clock)"
        )
        self._shutdown: list[Any] = []

    def trace_headers(self, context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
        """Trace context to store with enqueued jobs: the current span's, else the caller's."""
        carrier: dict[str, str] = {}
        if self.enabled:
            propagate.inject(carrier)
        if "traceparent" not in carrier:
            metadata = context.invocation_metadata() or ()
            for key, value in metadata:
                if key in TRACE_HEADERS and isinstance(value, str):
                    carrier[key] = value
        return carrier

    def on_delivered(self, batch: Sequence[tuple[ShardKeys, Claimed]]) -> None:
        """Counts a batch of deliveries, records their lateness, and marks each
        hand-off with a span in the producer's trace (parent: the job's headers)."""
        per_queue = Counter(keys.queue for keys, _ in batch)
        for queue, n in per_queue.items():
            self.delivered.add(n, {"delayq.queue": queue})
        for keys, c in batch:
            rec = c.record
            self.lateness.record(rec.last_delivery_ms - rec.due_ms, {"delayq.queue": keys.queue})
            parent = propagate.extract(
                {k: rec.headers[k] for k in TRACE_HEADERS if k in rec.headers}
            )
            span = self._tracer.start_span(
                f"{keys.queue} deliver",
                context=parent,
                kind=trace.SpanKind.PRODUCER,
                attributes={
                    "messaging.system": "delayq",
                    "messaging.operation.type": "send",
                    "messaging.destination.name": keys.queue,
                    "messaging.message.id": c.job_id,
                    "delayq.attempt": rec.attempts,
                },
            )
            span.end()

    def on_acked(self, outcomes: Sequence[str]) -> None:
        for outcome, n in Counter(outcomes).items():
            self.acked.add(n, {"delayq.ack_result": outcome})

    def interceptors(self) -> Sequence[Any]:
        if not self.enabled:
            return ()
        from opentelemetry.instrumentation.grpc import aio_server_interceptor

        return (aio_server_interceptor(),)  # type: ignore[no-untyped-call]

    def shutdown(self) -> None:
        for provider in self._shutdown:
            provider.shutdown()


def setup(enabled: bool) -> Telemetry:
    """Installs SDK providers with OTLP/gRPC exporters when enabled."""
    if not enabled:
        return Telemetry(False)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": "delayq-server"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(tracer_provider)
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
    )
    metrics.set_meter_provider(meter_provider)
    tel = Telemetry(True)
    tel._shutdown = [tracer_provider, meter_provider]
    return tel
