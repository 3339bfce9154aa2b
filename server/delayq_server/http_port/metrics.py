"""GET /metrics on the admin HTTP port: the OpenTelemetry instruments in Prometheus text.

One set of instruments feeds every exporter: the Prometheus reader
(otel_providers.py) renders them here, and OTLP keeps exporting when
configured. Queue gauges refresh before rendering when stale (queue_gauges.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from delayq_server.queue_gauges import QueueGauges


def add_routes(app: web.Application, registry: Any, gauges: QueueGauges) -> None:
    async def metrics(_request: web.Request) -> web.Response:
        await gauges.maybe_refresh()
        # In the event loop: gauge callbacks read the dispatcher's live state,
        # which only this thread may touch; a render takes about a millisecond
        # per few hundred series.
        body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/metrics", metrics)
