"""Per-namespace quota state in Redis: enqueue token bucket, queue set, stream slots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redis.commands.core import AsyncScript

from delayq_server.store import scripts
from delayq_server.store.keys import (
    ShardKeys,
    consume_streams_key,
    enqueue_rate_key,
    namespace_queues_key,
    queue_meta_key,
)

if TYPE_CHECKING:
    from delayq_server.redis_client import RedisClient


@dataclass(frozen=True, slots=True)
class Taken:
    ok: bool
    retry_after_ms: int  # when not ok: -1 = never at once (n over the burst)
    taken: int = 0  # when ok: tokens taken (n, or more up to `up_to`)


def _now_arg(now_ms: int | None) -> str:
    return "" if now_ms is None else str(now_ms)


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class QuotaStore:
    """Quota bookkeeping; every operation is O(1) in Redis but `namespace_jobs`."""

    def __init__(self, client: RedisClient) -> None:
        self.redis = client
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(scripts.source(name)) for name in scripts.QUOTA_NAMES
        }

    async def take_enqueue(
        self,
        namespace: str,
        n: int,
        rate: float,
        burst: int,
        now_ms: int | None = None,
        *,
        up_to: int = 0,
    ) -> Taken:
        """Takes n tokens, or as many as are there up to ``up_to`` (at least n)."""
        ok, retry, taken = await self._scripts["quota_rate"](
            keys=[enqueue_rate_key(namespace)],
            args=[_now_arg(now_ms), rate, burst, n, max(n, up_to)],
        )
        return Taken(int(ok) == 1, int(retry), int(taken))

    async def admit_queue(self, namespace: str, queue: str, most: int) -> bool:
        """Counts a queue against the namespace's quota; False when it is full."""
        out = await self._scripts["quota_queue"](
            keys=[namespace_queues_key(namespace)], args=[queue, most]
        )
        return int(out) == 1

    async def queue_exists(self, namespace: str, queue: str) -> bool:
        return bool(await self.redis.exists(queue_meta_key(namespace, queue)))

    async def hold_stream(
        self, namespace: str, stream_id: str, most: int, ttl_ms: int, now_ms: int | None = None
    ) -> bool:
        """Takes (or renews) a Consume stream slot; False when the namespace has `most`."""
        ok, _ = await self._scripts["quota_stream"](
            keys=[consume_streams_key(namespace)], args=[_now_arg(now_ms), stream_id, most, ttl_ms]
        )
        return int(ok) == 1

    async def drop_stream(self, namespace: str, stream_id: str) -> None:
        await self.redis.zrem(consume_streams_key(namespace), stream_id)

    async def namespace_jobs(self, namespace: str) -> int:
        """Jobs stored in a namespace (scheduled, ready, leased, dead): one pipelined
        read over its queues' shards, bounded by the queue quota."""
        queues = sorted(_s(q) for q in await self.redis.smembers(namespace_queues_key(namespace)))
        if not queues:
            return 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for q in queues:
                pipe.hget(queue_meta_key(namespace, q), "shards")
            counts = await pipe.execute()
        async with self.redis.pipeline(transaction=False) as pipe:
            for q, raw in zip(queues, counts, strict=True):
                for shard in range(int(raw or 0)):
                    keys = ShardKeys(namespace, q, shard)
                    pipe.hget(keys.stats, "backlog")
                    pipe.llen(keys.ready)
                    pipe.zcard(keys.leased)
                    pipe.zcard(keys.dead)
            values = await pipe.execute()
        return sum(max(0, int(v or 0)) for v in values)
