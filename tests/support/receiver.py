"""A real HTTP receiver for push tests: aiohttp on 127.0.0.1, port 0, on its own thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True)
class Hit:
    """One request as the receiver saw it."""

    n: int  # 1-based arrival order
    at: float  # time.monotonic() on arrival
    wall: float  # time.time() on arrival (lateness against the body's due_time)
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    request: web.Request = field(repr=False, compare=False)  # for streaming answers


Behaviour = Callable[[Hit], Awaitable[web.StreamResponse]]


async def ok(_hit: Hit) -> web.StreamResponse:
    return web.Response(text="ok")


class Receiver:
    """Answers each request with ``behaviour(hit)``, run in the receiver's event loop;
    counts requests in flight (max_in_flight) for concurrency checks."""

    def __init__(self, behaviour: Behaviour = ok) -> None:
        self.behaviour = behaviour
        self.hits: list[Hit] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        hit = Hit(
            len(self.hits) + 1,
            time.monotonic(),
            time.time(),
            request.method,
            request.path,
            dict(request.headers),
            body,
            request,
        )
        self.hits.append(hit)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self.behaviour(hit)
        finally:
            self.in_flight -= 1

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def start(self) -> Receiver:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
