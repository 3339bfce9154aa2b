"""The caller's trace context, stored in the headers of a job it enqueues.

A unary Enqueue carries the caller's context in its gRPC metadata (where an
OpenTelemetry client interceptor puts it) and the server stores it in the job. A
gathered batch cannot: it is one call, or one message on a long-lived
EnqueueStream, for many callers. So the AsyncClient copies each caller's current
context into its own job's headers when OpenTelemetry is installed and a span is
current; a `traceparent` the caller set itself wins. Without OpenTelemetry this
costs nothing.
"""

from __future__ import annotations

try:
    from opentelemetry import propagate, trace
except ImportError:  # the client does not depend on OpenTelemetry
    propagate = None  # type: ignore[assignment]

__all__ = ["current_context"]


def current_context() -> dict[str, str] | None:
    """W3C trace headers of the current span, or None when there is none."""
    if propagate is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None
