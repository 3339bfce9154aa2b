"""One aiohttp server on --http-listen, in the gRPC server's event loop.

Off unless --http-listen is set. Features (Prometheus /metrics in metrics.py,
the dashboard) add their routes with `HttpPort.app.router` before `start()`; the port itself
serves only /healthz. docs/design.md "Admin HTTP port".
"""

from __future__ import annotations

from aiohttp import web


class HttpPort:
    """The admin HTTP listener of one server process."""

    def __init__(self, listen: str) -> None:
        self.listen = listen
        self.app = web.Application()
        self.app.router.add_get("/healthz", self._healthz)
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def _healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def start(self) -> int:
        """Binds and serves; returns the bound port (port 0 picks one)."""
        host, _, port = self.listen.rpartition(":")
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host.strip("[]"), int(port))
        try:
            await site.start()
        except OSError:  # the caller turns it into a one-line start-up refusal
            await self._runner.cleanup()
            self._runner = None
            raise
        # The runner lists the bound addresses (the real port when port 0 was asked).
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
