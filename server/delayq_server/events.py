"""Wake-ups: local broadcasts plus a sharded pub/sub listener for other replicas.

Scripts SPUBLISH "<shard prefix> ready <count>" when an empty ready list gets jobs
and "<shard prefix> due <ms>" when a shard's earliest due time moves earlier, on
the shard's own channel (its hash tag: on a cluster only the owning node carries
it). Every replica subscribes to the shards of the queues it knows, so a job
enqueued through one server wakes the promoter and the idle Consume streams of
all of them. Pub/sub is at-most-once: every (re)subscription of a channel,
including redis-py's silent reconnect, re-checks that shard (the replica's own
channel: everything), a PING every second on every connection finds a dead one
within a few seconds, and waiters also time out (a fallback, never the thing
that decides delivery time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable

from redis.asyncio.client import PubSub
from redis.asyncio.cluster import ClusterPubSub, RedisCluster

from delayq_server import logs
from delayq_server.redis_client import RedisClient
from delayq_server.store.keys import ShardKeys, server_channel
from delayq_server.tasks import cancel_and_wait

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
SUBSCRIBE_CHUNK = 500  # channels per SSUBSCRIBE on one node (one slot each on a cluster)


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
    """Turns shard-channel messages into hub events and credit returns for our streams.

    ``want`` adds the shards of a queue this replica learnt about (Timers);
    ``on_subscribed(tag)`` runs after each (re)subscription of a shard's channel
    (``None``: the replica's own channel, after which everything is re-checked).
    """

    def __init__(
        self,
        client: RedisClient,
        hub: EventHub,
        server_id: str,
        on_message: Callable[[str, list[str]], None],
        on_subscribed: Callable[[str | None], None] = lambda tag: None,
    ) -> None:
        self._client = client
        self._hub = hub
        self._own = server_channel(server_id)
        # Messages on this replica's own channel: "<kind> <item> ...", e.g. credit
        # for our streams' leases (Dispatcher.on_message knows the kinds).
        self._on_message = on_message
        self._on_subscribed = on_subscribed
        self._task: asyncio.Task[None] | None = None
        self._wanted: dict[str, str] = {}  # shard tag -> its channel, listened to
        self._pending: set[str] = set()  # wanted tags not yet subscribed on this connection
        self._more = asyncio.Event()
        self.ready = asyncio.Event()
        self.resubscribes = 0  # (re)subscriptions of our own channel, the first one included

    @property
    def subscribed_tags(self) -> frozenset[str]:
        return frozenset(self._wanted.keys() - self._pending)

    def want(self, shards: Iterable[ShardKeys]) -> None:
        """Listen to these shards' channels too (subscribed in the background)."""
        new = {k.tag: k.channel for k in shards if k.tag not in self._wanted}
        if new:
            self._wanted.update(new)
            self._pending.update(new)
            self._more.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="pubsub")

    async def stop(self) -> None:
        if self._task:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            readers: dict[int, tuple[PubSub, asyncio.Task[None]]] = {}
            try:
                async with self._client.pubsub() as ps:
                    try:
                        await self._session(ps, readers)
                    finally:
                        for _, task in readers.values():
                            task.cancel()
                        await asyncio.gather(
                            *(t for _, t in readers.values()), return_exceptions=True
                        )
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("pub/sub listener: %s; reconnecting", exc)
                await asyncio.sleep(0.5)

    def _connections(self, ps: PubSub) -> list[PubSub]:
        """One subscribed connection per node (a cluster's per-node connections)."""
        if isinstance(ps, ClusterPubSub):
            return list(ps.node_pubsub_mapping.values())
        return [ps]

    async def _session(
        self, ps: PubSub, readers: dict[int, tuple[PubSub, asyncio.Task[None]]]
    ) -> None:
        """Subscribes (and keeps subscribing what is wanted), one reader per node
        connection, a PING on each every second; raises when one looks dead."""
        if isinstance(self._client, RedisCluster):
            await self._client.initialize()  # the slot map routes each SSUBSCRIBE
        self._pending = set(self._wanted)  # a new connection subscribes everything
        await ps.ssubscribe(self._own)
        clock = asyncio.get_running_loop().time
        last_pong: dict[int, float] = {}
        while True:
            if self._pending:
                tags, self._pending = sorted(self._pending), set()
                for i in range(0, len(tags), SUBSCRIBE_CHUNK):
                    chunk = tags[i : i + SUBSCRIBE_CHUNK]
                    await ps.ssubscribe(*(self._wanted[t] for t in chunk))
            now = clock()
            for conn in self._connections(ps):
                key = id(conn)
                if key not in readers:
                    last_pong[key] = now
                    task = asyncio.create_task(self._read(conn, key, last_pong), name="pubsub-read")
                    readers[key] = (conn, task)
            for key, (conn, task) in list(readers.items()):
                if task.done():
                    raise task.exception() or ConnectionError("pub/sub reader ended")
                if now - last_pong[key] > PONG_DEADLINE_S:
                    raise ConnectionError(f"no PING reply in {PONG_DEADLINE_S:.0f}s")
                await conn.ping(PING_TOKEN)
            self._more.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._more.wait(), PING_INTERVAL_S)

    async def _read(self, conn: PubSub, key: int, last_pong: dict[int, float]) -> None:
        """Reads one node connection's messages (the session task writes to it)."""
        clock = asyncio.get_running_loop().time
        while True:
            msg = await conn.get_message(timeout=PING_INTERVAL_S)
            if msg is None:
                continue
            kind = msg.get("type")
            if kind == "smessage":
                self._dispatch(msg["channel"], msg["data"])
            elif kind == "pong":
                last_pong[key] = clock()
            elif kind == "ssubscribe":
                # Also after redis-py re-subscribed by itself on a new
                # connection: whatever was published in the gap is lost.
                last_pong[key] = clock()
                self._subscribed(msg["channel"].decode())

    def _subscribed(self, channel: str) -> None:
        if channel == self._own:
            self.resubscribes += 1
            if self.resubscribes > 1:
                logs.event(
                    log,
                    "redis_reconnected",
                    "Redis pub/sub subscribed again; re-checking every shard",
                    resubscribes=self.resubscribes - 1,
                )
            self.ready.set()
            self._on_subscribed(None)
        else:
            self._on_subscribed(tag_of(channel))

    def _dispatch(self, channel: bytes, data: bytes) -> None:
        text = data.decode()
        if channel.decode() == self._own:
            kind, _, rest = text.partition(" ")
            self._on_message(kind, rest.split())
            return
        prefix, _, rest = text.partition(" ")
        kind, _, detail = rest.partition(" ")
        self._hub.fire(kind, tag_of(prefix), detail)
