"""Loopback TCP proxies for fault tests: lose one Redis reply, stall or cut connections.

``CuttableProxy`` drops every open connection at once (a transport blip).
``LossyProxy``, in front of redis-server, can lose one reply (a lost-reply fault).

Armed with a byte string, it forwards the next client command containing it to
Redis, waits for Redis' reply (so the command really ran), drops that reply and
closes both sockets. The client sees a dropped connection, as after a network
blip, and re-sends on a new connection, which the proxy forwards normally.

It can also stall the current pub/sub connections (a half-open socket: bytes in
both directions vanish, nothing is closed) while new connections work.

Use ``LossyProxy`` inside a test's event loop, or ``ThreadedProxy`` for a
server running in another process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class LossyProxy:
    """Forwards 127.0.0.1:<port> to the upstream Redis; see the module docstring."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._up = (upstream_host, upstream_port)
        self._server: asyncio.Server | None = None
        self._armed: bytes | None = None
        self.port = 0
        self.dropped = asyncio.Event()  # set once a reply was dropped
        self.connections = 0
        self._subscribers: set[int] = set()  # connection numbers that sent SUBSCRIBE
        self._stalled: set[int] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> LossyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def drop_reply_to(self, needle: bytes) -> None:
        """Loses the reply to the next command whose bytes contain ``needle`` (once)."""
        self.dropped.clear()
        self._armed = needle

    def stall_subscribers(self) -> int:
        """Silently swallows all traffic of the pub/sub connections open now."""
        self._stalled |= self._subscribers
        return len(self._stalled)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        try:
            u_reader, u_writer = await asyncio.open_connection(*self._up)
        except OSError:
            c_writer.close()
            return
        lose_next_reply = asyncio.Event()

        async def upstream() -> None:  # client -> redis
            while data := await c_reader.read(65536):
                if b"SUBSCRIBE" in data.upper():
                    self._subscribers.add(number)
                if number in self._stalled:
                    continue
                if self._armed is not None and self._armed in data:
                    self._armed = None
                    lose_next_reply.set()
                u_writer.write(data)
                await u_writer.drain()

        async def downstream() -> None:  # redis -> client
            while data := await u_reader.read(65536):
                if number in self._stalled:
                    continue
                if lose_next_reply.is_set():
                    self.dropped.set()
                    return  # the command ran; its reply is lost with the connection
                c_writer.write(data)
                await c_writer.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for writer in (c_writer, u_writer):
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()


class ThreadedProxy:
    """A LossyProxy on its own event loop thread, for servers in other processes."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.proxy = LossyProxy(upstream_host, upstream_port)

    def start(self) -> ThreadedProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(10)
        return self

    @property
    def url(self) -> str:
        return self.proxy.url

    def drop_reply_to(self, needle: bytes) -> None:
        async def arm() -> None:
            self.proxy.drop_reply_to(needle)

        asyncio.run_coroutine_threadsafe(arm(), self._loop).result(10)

    def stall_subscribers(self) -> int:
        async def stall() -> int:
            return self.proxy.stall_subscribers()

        return asyncio.run_coroutine_threadsafe(stall(), self._loop).result(10)

    def wait_dropped(self, timeout: float) -> bool:
        async def wait() -> bool:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proxy.dropped.wait(), timeout)
            return self.proxy.dropped.is_set()

        return asyncio.run_coroutine_threadsafe(wait(), self._loop).result(timeout + 5)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def __enter__(self) -> ThreadedProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def threaded_proxy(upstream_host: str, upstream_port: int) -> Iterator[ThreadedProxy]:
    with ThreadedProxy(upstream_host, upstream_port) as proxy:
        yield proxy


class CuttableProxy:
    """Forwards 127.0.0.1:<port> to a target; `cut()` drops every open connection
    (both sides see a reset) while new connections keep being accepted."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.connections = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> CuttableProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        for w in list(self._writers):
            transport = w.transport
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # RST, no goodbye
        self._writers.clear()

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
