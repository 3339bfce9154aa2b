"""Wake-ups: local broadcasts plus a Redis pub/sub listener for other replicas.

Scripts publish "<shard prefix> ready <count>" when an empty ready list gets jobs and
"<shard prefix> due <ms>" when a shard's earliest due time moves earlier. Every
replica listens, so a job enqueued through one server wakes the promoter and
the idle Consume streams of all of them. Pub/sub is at-most-once: every
(re)subscribe, including redis-py's silent reconnect, triggers a full re-check,
a PING every second finds a dead subscription within a few seconds, and
waiters also time out (a fallback, never the thing that decides delivery time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable

from redis.asyncio.client import PubSub

from delayq_server import logs
from delayq_server.redis_client import RedisClient
from delayq_server.store.keys import EVENTS_CHANNEL, server_channel

log = logging.getLogger(__name__)

READY = "ready"  # jobs arrived in an empty ready list
DUE = "due"  # the earliest due time moved earlier (or leases were reaped)
LEASE = "lease"  # a claim made a lease that ends before every other lease of the shard

# A subscriber that has not answered a PING within PONG_DEADLINE_S is treated as
# dead (half-open socket, killed connection) and replaced: events may be lost
# for at most that long before the re-check that follows a re-subscribe.
PING_INTERVAL_S = 1.0
PONG_DEADLINE_S = 3.0
PING_TOKEN = b"delayq-alive"


def tag_of(prefix: str) -> str:
    """'dq:{ns/q/0}:' -> 'ns/q/0'."""
    return prefix[prefix.find("{") + 1 : prefix.rfind("}")]


class EventHub:
    """Fan-out of wake-ups to subscribed asyncio.Events, keyed by (kind, shard tag)."""

    def __init__(self) -> None:
        self._subs: dict[tuple[str, str], set[asyncio.Event]] = defaultdict(set)
        self._handlers: dict[str, list[Callable[[str, str], None]]] = defaultdict(list)
        # Called for an event no loop here waits for (a stopped shard's "due").
        self.on_unheard: Callable[[str, str], None] = lambda kind, tag: None

    def listen(self, kind: str, handler: Callable[[str, str], None]) -> None:
        """Calls ``handler(tag, detail)`` for every event of ``kind`` (the
        dispatcher's ready board decides which streams to wake); ``detail`` is
        the rest of the message, e.g. the count of a "ready" event."""
        self._handlers[kind].append(handler)

    def subscribe(self, kind: str, tag: str, event: asyncio.Event) -> None:
        self._subs[(kind, tag)].add(event)

    def unsubscribe(self, kind: str, tag: str, event: asyncio.Event) -> None:
        subs = self._subs.get((kind, tag))
        if subs is not None:
            subs.discard(event)
            if not subs:
                del self._subs[(kind, tag)]

    def fire(self, kind: str, tag: str, detail: str = "") -> None:
        subs = self._subs.get((kind, tag))
        for event in subs or ():
            event.set()
        for handler in self._handlers.get(kind, ()):
            handler(tag, detail)
        if not subs:
            self.on_unheard(kind, tag)


class PubSubListener:
    """Turns pub/sub messages into hub events and credit returns for our streams."""

    def __init__(
        self,
        client: RedisClient,
        hub: EventHub,
        server_id: str,
        on_message: Callable[[str, list[str]], None],
        on_subscribed: Callable[[], None] = lambda: None,
    ) -> None:
        self._client = client
        self._hub = hub
        self._server_id = server_id
        # Messages on this replica's own channel: "<kind> <item> ...", e.g. credit
        # for our streams' leases (Dispatcher.on_message knows the kinds).
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()
        self.resubscribes = 0  # (re)subscriptions seen, the first one included

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pubsub")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                async with self._client.pubsub() as ps:
                    await ps.subscribe(EVENTS_CHANNEL, server_channel(self._server_id))
                    await self._listen(ps)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pub/sub listener: %s; reconnecting", exc)
                await asyncio.sleep(0.5)

    async def _listen(self, ps: PubSub) -> None:
        """Reads messages and pings until the subscription looks dead (then raises)."""
        clock = asyncio.get_running_loop().time
        last_pong = next_ping = clock()
        while True:
            now = clock()
            if now - last_pong > PONG_DEADLINE_S:
                raise ConnectionError(f"no PING reply in {PONG_DEADLINE_S:.0f}s")
            if now >= next_ping:
                await ps.ping(PING_TOKEN)
                next_ping = now + PING_INTERVAL_S
            msg = await ps.get_message(timeout=max(0.01, next_ping - now))
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "message":
                self._dispatch(msg["channel"], msg["data"])
            elif kind == "pong":
                last_pong = clock()
            elif kind == "subscribe" and msg["channel"] == EVENTS_CHANNEL.encode():
                # Also after redis-py re-subscribed by itself on a new
                # connection: whatever was published in the gap is lost.
                self.resubscribes += 1
                if self.resubscribes > 1:
                    logs.event(
                        log,
                        "redis_reconnected",
                        "Redis pub/sub subscribed again; re-checking every shard",
                        resubscribes=self.resubscribes - 1,
                    )
                last_pong = clock()
                self.ready.set()
                self._on_subscribed()

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        text = data.decode()
        if channel.decode() != EVENTS_CHANNEL:
            kind, _, rest = text.partition(" ")
            self._on_message(kind, rest.split())
            return
        prefix, _, rest = text.partition(" ")
        kind, _, detail = rest.partition(" ")
        self._hub.fire(kind, tag_of(prefix), detail)
