"""The web dashboard on the admin HTTP port (issue 14): JSON API and static pages."""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from delayq_server.dashboard.api import DashboardApi

__all__ = ["DashboardApi", "add_routes"]


def add_routes(app: web.Application, api: DashboardApi) -> None:
    """/api/... and the page at /dashboard/ (plain files shipped in the package)."""
    api.add_routes(app)
    static = resources.files("delayq_server") / "dashboard" / "static"

    async def index(_request: web.Request) -> web.StreamResponse:
        return web.Response(
            body=(static / "index.html").read_bytes(),
            content_type="text/html",
            headers={"Cache-Control": "no-store"},
        )

    async def root(_request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/dashboard/")

    app.router.add_get("/", root)
    # Routes match exactly; the address typed without its slash reaches the page too.
    app.router.add_get("/dashboard", root)
    app.router.add_get("/dashboard/", index)
    app.router.add_static("/dashboard/static/", str(static), show_index=False)
