"""OpenTelemetry SDK providers built from the standard OTEL_* environment.

Which exporters run (docs/decisions.md, "Telemetry switches"):
* traces: with ``--otel``, ``OTEL_TRACES_EXPORTER`` (default ``otlp``; ``console``,
  ``none``, or a comma list); set alone (not ``none``), the variable turns
  tracing on too;
* metrics: with ``--otel``, ``OTEL_METRICS_EXPORTER`` likewise (``otlp``,
  ``console``, ``prometheus``, ``none``); ``--http-listen`` always adds the
  Prometheus reader behind ``/metrics``;
* ``OTEL_SDK_DISABLED=true`` turns everything off.
The resource is ``Resource.create()``: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` win over the default ``service.name=delayq-server``.
The sampler is the SDK's from ``OTEL_TRACES_SAMPLER``/``_ARG`` (default
parentbased_always_on). OTLP settings are the exporters' own variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_SERVICE_NAME = "delayq-server"
# OTLP/console metric export every 10 s unless OTEL_METRIC_EXPORT_INTERVAL says
# otherwise (the SDK's 60 s default made dashboards lag a minute behind).
DEFAULT_EXPORT_INTERVAL_MS = 10_000

# Histogram boundaries (seconds). Lateness is the timer-lag SLI: 1 ms steps up
# to 10 ms, then coarser up to an hour.
LATENESS_BOUNDS_S = (
    *(i / 1000 for i in range(0, 11)),
    0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    3600.0,
)  # fmt: skip
SCRIPT_BOUNDS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
TO_ACK_BOUNDS_S = (
    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0,
    86400.0, 604800.0,
)  # fmt: skip
HISTOGRAM_BOUNDS = {
    "delayq.delivery.lateness": LATENESS_BOUNDS_S,
    "delayq.redis.script.duration": SCRIPT_BOUNDS_S,
    "delayq.job.enqueue_to_ack": TO_ACK_BOUNDS_S,
}


class TelemetryConfigError(ValueError):
    """An OTEL_* value delayq cannot honour; the message names the variable."""


def _names(env: Mapping[str, str], var: str, default: str) -> list[str]:
    raw = env.get(var, "").strip() or default
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    allowed = {"otlp", "console", "none"} | ({"prometheus"} if "METRICS" in var else set())
    bad = [n for n in names if n not in allowed]
    if bad:
        raise TelemetryConfigError(
            f"{var}: {', '.join(bad)} is not one of {', '.join(sorted(allowed))}"
        )
    return [n for n in names if n != "none"]


@dataclass
class Plan:
    """What to install, decided from flags and environment before any import."""

    tracing: bool = False  # spans are made (ids in logs, context in jobs) ...
    traces: list[str] = field(default_factory=list)  # ... and sent to these exporters
    metrics: list[str] = field(default_factory=list)  # push exporters (otlp, console)
    prometheus: bool = False

    @property
    def metering(self) -> bool:
        return bool(self.metrics) or self.prometheus


def plan(otel: bool, http: bool, env: Mapping[str, str] | None = None) -> Plan:
    """``--otel`` with ``OTEL_TRACES_EXPORTER=none`` still traces (log lines carry
    trace ids, jobs carry context) but exports no span."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return Plan()
    traces = _names(env, "OTEL_TRACES_EXPORTER", "otlp" if otel else "none")
    metrics = _names(env, "OTEL_METRICS_EXPORTER", "otlp" if otel else "none")
    prometheus = http or "prometheus" in metrics
    return Plan(otel or bool(traces), traces, [m for m in metrics if m != "prometheus"], prometheus)


@dataclass
class Providers:
    tracer: Any = None
    meter: Any = None
    prometheus_registry: Any = None  # prometheus_client CollectorRegistry behind /metrics
    push_metrics: bool = False  # an OTLP or console metric exporter runs

    def shutdown(self) -> None:
        for provider in (self.tracer, self.meter):
            if provider is not None:
                provider.shutdown()


def resource(extra: Mapping[str, str] | None = None) -> Any:
    from opentelemetry.sdk.resources import Resource

    res = Resource.create(dict(extra or {}))
    if str(res.attributes.get("service.name", "")).startswith("unknown_service"):
        res = res.merge(Resource({"service.name": DEFAULT_SERVICE_NAME}))
    return res


def install(p: Plan, extra_resource: Mapping[str, str] | None = None) -> Providers:
    """Builds and installs the global providers the plan asks for."""
    out = Providers()
    if not (p.tracing or p.metering):
        return out
    from opentelemetry import metrics, trace

    res = resource(extra_resource)
    if p.tracing:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

        tracer_provider = TracerProvider(resource=res)  # sampler: OTEL_TRACES_SAMPLER
        for name in p.traces:
            exporter: SpanExporter
            if name == "console":
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                exporter = ConsoleSpanExporter()
            else:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter,
                )

                exporter = OTLPSpanExporter()
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        out.tracer = tracer_provider
    if p.metering:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

        readers: list[MetricReader] = []
        interval = float(os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", DEFAULT_EXPORT_INTERVAL_MS))
        for name in p.metrics:
            if name == "console":
                from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

                readers.append(PeriodicExportingMetricReader(ConsoleMetricExporter(), interval))
            else:
                from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                    OTLPMetricExporter,
                )

                readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(), interval))
        if p.prometheus:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry

            out.prometheus_registry = CollectorRegistry(auto_describe=True)
            readers.append(PrometheusMetricReader(registry=out.prometheus_registry))
        out.push_metrics = bool(p.metrics)
        views = [
            View(
                instrument_name=name,
                aggregation=ExplicitBucketHistogramAggregation(boundaries=bounds),
            )
            for name, bounds in HISTOGRAM_BOUNDS.items()
        ]
        meter_provider = MeterProvider(resource=res, metric_readers=readers, views=views)
        metrics.set_meter_provider(meter_provider)
        out.meter = meter_provider
    return out
