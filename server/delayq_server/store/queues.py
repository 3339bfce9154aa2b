"""Queue settings, pause flags and deletion (issue 14): the queue meta hash's other fields.

A queue's settings live in its meta hash beside ``shards`` and ``bucket_width``.
Every replica caches them (Enqueue, Consume and Ack read them on every call) and
drops its copy when the queue's "changed" or "deleted" event arrives over
pub/sub; a pub/sub gap clears the whole cache (App._resync).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq_server.store.keys import (
    PUSH_QUEUES_KEY,
    PUSH_VERSION_KEY,
    QUEUES_KEY,
    ShardKeys,
    namespace_queues_key,
    queue_event_prefix,
    queue_meta_key,
)
from delayq_server.store.layout import LAYOUT

if TYPE_CHECKING:
    from delayq_server.store.store import Store

QUEUE_EVENT = "queue"  # "<queue prefix> queue changed" | "... queue deleted"

# Meta hash fields of the changeable settings (absent = the server default).
F_LEASE = "lease_ms"
F_ATTEMPTS = "max_attempts"
F_RETRY = "retry"  # "initial_ms,max_ms,multiplier,jitter"
F_COMPLETED = "completed_retention_ms"
F_DEAD_AGE = "dead_retention_ms"
F_DEAD_MAX = "dead_max_jobs"
# The push target as the JSON object of a --push-config target, secret included
# (Redis holds the HMAC key: docs/decisions.md "Push targets in queue settings").
F_PUSH = "push"
F_PAUSED = "paused"
F_CREATED = "created_ms"
SETTING_FIELDS = (F_LEASE, F_ATTEMPTS, F_RETRY, F_COMPLETED, F_DEAD_AGE, F_DEAD_MAX, F_PUSH)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True, slots=True)
class Retry:
    initial_ms: int
    max_ms: int
    multiplier: float
    jitter: float

    def encode(self) -> str:
        return f"{self.initial_ms},{self.max_ms},{self.multiplier!r},{self.jitter!r}"

    @classmethod
    def decode(cls, text: str) -> Retry:
        a, b, c, d = text.split(",")
        return cls(int(a), int(b), float(c), float(d))


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's settings as stored; 0 / None = the server default."""

    shards: int
    lease_ms: int = 0
    max_attempts: int = 0
    retry: Retry | None = None
    completed_retention_ms: int | None = None
    dead_retention_ms: int = 0
    dead_max_jobs: int = 0
    paused: bool = False
    created_ms: int = 0
    push: str | None = None  # JSON target (push/config.py's format) or no push

    def fields(self) -> dict[str, str]:
        """The changeable settings as meta hash fields (defaults left out)."""
        out: dict[str, str] = {}
        if self.lease_ms:
            out[F_LEASE] = str(self.lease_ms)
        if self.max_attempts:
            out[F_ATTEMPTS] = str(self.max_attempts)
        if self.retry is not None:
            out[F_RETRY] = self.retry.encode()
        if self.completed_retention_ms is not None:
            out[F_COMPLETED] = str(self.completed_retention_ms)
        if self.dead_retention_ms:
            out[F_DEAD_AGE] = str(self.dead_retention_ms)
        if self.dead_max_jobs:
            out[F_DEAD_MAX] = str(self.dead_max_jobs)
        if self.push is not None:
            out[F_PUSH] = self.push
        return out

    @classmethod
    def from_meta(cls, meta: dict[str, str]) -> QueueSettings:
        completed = meta.get(F_COMPLETED)
        return cls(
            shards=int(meta.get("shards", "0")),
            lease_ms=int(meta.get(F_LEASE, "0")),
            max_attempts=int(meta.get(F_ATTEMPTS, "0")),
            retry=Retry.decode(meta[F_RETRY]) if F_RETRY in meta else None,
            completed_retention_ms=None if completed is None else int(completed),
            dead_retention_ms=int(meta.get(F_DEAD_AGE, "0")),
            dead_max_jobs=int(meta.get(F_DEAD_MAX, "0")),
            paused=meta.get(F_PAUSED) == "1",
            created_ms=int(meta.get(F_CREATED, "0")),
            push=meta.get(F_PUSH),
        )


@dataclass(frozen=True, slots=True)
class ShardCounts:
    scheduled: int
    ready: int
    leased: int
    dead: int
    completed: int

    @property
    def total(self) -> int:
        return self.scheduled + self.ready + self.leased + self.dead + self.completed


class Queues:
    """Settings, pause and deletion of queues; one per Store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._cache: dict[tuple[str, str], QueueSettings | None] = {}

    @property
    def _redis(self) -> Any:
        return self._store.redis

    def cached(self, namespace: str, queue: str) -> QueueSettings | None:
        """The cached settings, if loaded (never reads Redis: for hot paths)."""
        return self._cache.get((namespace, queue))

    async def settings(self, namespace: str, queue: str) -> QueueSettings | None:
        """The queue's settings (cached); None for an unknown queue."""
        key = (namespace, queue)
        if key in self._cache:
            return self._cache[key]
        raw = await self._redis.hgetall(queue_meta_key(namespace, queue))
        meta = {_s(k): _s(v) for k, v in raw.items()}
        out = QueueSettings.from_meta(meta) if "shards" in meta else None
        if out is not None:  # an unknown queue is not cached: a first Enqueue creates it
            self._cache[key] = out
        return out

    async def fresh(self, namespace: str, queue: str) -> QueueSettings | None:
        """The settings read from Redis now (admin reads show the truth, not the cache)."""
        self._cache.pop((namespace, queue), None)
        return await self.settings(namespace, queue)

    def forget(self, namespace: str, queue: str) -> None:
        self._cache.pop((namespace, queue), None)

    def forget_all(self) -> None:
        self._cache.clear()

    async def create(
        self, namespace: str, queue: str, settings: QueueSettings, bucket_width_ms: int
    ) -> bool:
        """Creates the queue with these settings; False when it exists already."""
        meta = queue_meta_key(namespace, queue)
        now = await self._store.time_ms()
        # shards first, with HSETNX: a concurrent first Enqueue creating the
        # queue with the defaults and this call cannot both win.
        if not await self._redis.hsetnx(meta, "shards", settings.shards):
            return False
        fields = {
            **settings.fields(),
            "bucket_width": str(bucket_width_ms),
            "layout": str(LAYOUT),  # store/layout.py
            F_CREATED: str(now),
        }
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hset(meta, mapping=fields)
            pipe.sadd(QUEUES_KEY, f"{namespace}/{queue}")
            if settings.push is not None:
                pipe.sadd(PUSH_QUEUES_KEY, f"{namespace}/{queue}")
                pipe.incr(PUSH_VERSION_KEY)
            await pipe.execute()
        await self.changed(namespace, queue)  # pushers of every replica read its target
        return True

    async def update(self, namespace: str, queue: str, fields: dict[str, str | None]) -> None:
        """Sets (or, for None, clears back to the server default) meta fields."""
        meta = queue_meta_key(namespace, queue)
        sets = {k: v for k, v in fields.items() if v is not None}
        dels = [k for k, v in fields.items() if v is None]
        async with self._redis.pipeline(transaction=False) as pipe:
            if sets:
                pipe.hset(meta, mapping=sets)
            if dels:
                pipe.hdel(meta, *dels)
            if F_PUSH in fields:  # the pushers' index follows the setting
                if fields[F_PUSH] is None:
                    pipe.srem(PUSH_QUEUES_KEY, f"{namespace}/{queue}")
                else:
                    pipe.sadd(PUSH_QUEUES_KEY, f"{namespace}/{queue}")
                pipe.incr(PUSH_VERSION_KEY)
            await pipe.execute()
        await self.changed(namespace, queue)

    async def push_queues(self) -> list[tuple[str, str]]:
        """Queues whose settings hold a push target, as (namespace, queue)."""
        members = await self._redis.smembers(PUSH_QUEUES_KEY)
        return [tuple(_s(m).split("/", 1)) for m in sorted(members)]  # type: ignore[misc]

    async def push_version(self) -> int:
        """Changes of push targets so far (any queue): pushers poll it."""
        return int(await self._redis.get(PUSH_VERSION_KEY) or 0)

    async def push_target(self, namespace: str, queue: str) -> str | None:
        """The queue's push target JSON read from Redis now (None: no push)."""
        raw = await self._redis.hget(queue_meta_key(namespace, queue), F_PUSH)
        return None if raw is None else _s(raw)

    async def set_paused(self, namespace: str, queue: str, shards: int, paused: bool) -> None:
        """Pauses (or resumes) every shard, then records the flag in the meta hash.

        The shard flags decide (claim.lua reads them atomically); the meta flag
        is what listings show.
        """
        await asyncio.gather(
            *(
                self._store._run(
                    "pause",
                    [k.paused, k.ready],
                    [k.prefix, "1" if paused else "0", k.channel],
                )
                for k in (ShardKeys(namespace, queue, s) for s in range(shards))
            )
        )
        await self._redis.hset(queue_meta_key(namespace, queue), F_PAUSED, "1" if paused else "0")
        await self.changed(namespace, queue)

    async def counts(self, keys: ShardKeys) -> ShardCounts:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.stats, "backlog")
            pipe.llen(keys.ready)
            pipe.zcard(keys.leased)
            pipe.zcard(keys.dead)
            pipe.zcard(keys.done)
            backlog, ready, leased, dead, done = await pipe.execute()
        return ShardCounts(max(0, int(backlog or 0)), ready, leased, dead, done)

    async def drop(self, namespace: str, queue: str, shards: int) -> ShardCounts | None:
        """Deletes an empty queue; returns the counts of a shard that is not empty
        (then nothing more is deleted)."""
        for s in range(shards):
            k = ShardKeys(namespace, queue, s)
            keys = [k.index, k.ready, k.leased, k.dead, k.done, k.expiring, k.stats]
            out = await self._store._run("drop_shard", [*keys, k.paused, k.events], [k.prefix])
            if int(out[0]) == 0:
                return ShardCounts(*(int(x) for x in out[1:]))
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(queue_meta_key(namespace, queue))
            pipe.srem(QUEUES_KEY, f"{namespace}/{queue}")
            pipe.srem(PUSH_QUEUES_KEY, f"{namespace}/{queue}")
            pipe.incr(PUSH_VERSION_KEY)
            pipe.srem(namespace_queues_key(namespace), queue)
            await pipe.execute()
        self._store.forget_queue(namespace, queue)
        await self._publish(namespace, queue, "deleted")
        return None

    async def changed(self, namespace: str, queue: str) -> None:
        self.forget(namespace, queue)
        await self._publish(namespace, queue, "changed")

    async def _publish(self, namespace: str, queue: str, what: str) -> None:
        """On shard 0's channel: every replica that knows the queue listens there
        (events.PubSubListener), and the message names the queue, not the shard."""
        await self._redis.spublish(
            ShardKeys(namespace, queue, 0).channel,
            f"{queue_event_prefix(namespace, queue)} {QUEUE_EVENT} {what}",
        )
