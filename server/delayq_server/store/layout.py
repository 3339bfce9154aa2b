"""Redis layout version: refuses v1 data (drain first) and checks record compaction."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from delayq_server.store.keys import QUEUES_KEY, ShardKeys, queue_meta_key

if TYPE_CHECKING:
    from delayq_server.redis_client import RedisClient

log = logging.getLogger(__name__)

LAYOUT = 2  # grouped records + splitting backlog buckets (docs/decisions.md, issue 12)
# A record with a 100-byte payload packs to ~150 bytes; record groups stay
# listpack-encoded (compact) only when Redis admits values that long.
RECOMMENDED_LISTPACK_VALUE = 256


class LayoutV1Data(Exception):
    """A queue holds jobs written by a server before layout v2."""


async def check(redis: RedisClient) -> None:
    """Stamps queues with the layout; refuses to start on v1 jobs (which v2 would not see).

    A queue created before layout v2 has no ``layout`` field in its meta hash.
    Empty, it is stamped v2; holding jobs, the start fails with what to do: v1
    data needs a drain with the previous release (CHANGELOG).
    """
    for raw in await redis.smembers(QUEUES_KEY):
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        ns, _, queue = name.partition("/")
        meta = queue_meta_key(ns, queue)
        shards, layout = await redis.hmget(meta, ["shards", "layout"])
        if layout is not None or shards is None:
            continue
        for s in range(int(shards)):
            k = ShardKeys(ns, queue, s)
            async with redis.pipeline(transaction=False) as pipe:
                for key in (k.v1_index, k.leased, k.dead, k.done):
                    pipe.zcard(key)
                pipe.llen(k.ready)
                counts = await pipe.execute()
            if any(counts):
                raise LayoutV1Data(
                    f"queue {name} shard {s} holds jobs stored by a delayq server before "
                    f"Redis layout v{LAYOUT}; drain it with that server first (CHANGELOG)"
                )
        await redis.hsetnx(meta, "layout", LAYOUT)


async def listpack_value_limit(redis: RedisClient) -> int | None:
    """Redis' hash-max-listpack-value, or None when CONFIG is not allowed (managed Redis)."""
    try:
        got = await redis.config_get("hash-max-listpack-value")
        value = got.get("hash-max-listpack-value") if isinstance(got, dict) else None
        return int(value) if value is not None else None
    except (ResponseError, TypeError, ValueError):
        return None


async def warn_if_not_compact(redis: RedisClient) -> None:
    limit = await listpack_value_limit(redis)
    if limit is not None and limit < RECOMMENDED_LISTPACK_VALUE:
        log.warning(
            "Redis hash-max-listpack-value is %d: job records longer than that use ~20%% more "
            "memory; set it to %d or more (README, Memory)",
            limit,
            RECOMMENDED_LISTPACK_VALUE,
        )
