"""The admin HTTP port: /healthz, /metrics and the dashboard on one aiohttp server."""

from delayq_server.http_port.server import HttpPort

__all__ = ["HttpPort"]
