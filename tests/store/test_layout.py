"""Redis layout v2: v1 jobs are refused at start, never silently ignored (issue 12)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from delayq_server.store import Store, layout
from delayq_server.store.keys import QUEUES_KEY, ShardKeys, queue_meta_key
from tests.support.seed import T0, spec


async def _v1_queue(aredis: aioredis.Redis, queue: str) -> ShardKeys:
    """A queue as a server before layout v2 left it: meta without "layout"."""
    await aredis.hset(queue_meta_key("default", queue), mapping={"shards": 1, "bucket_width": 1000})
    await aredis.sadd(QUEUES_KEY, f"default/{queue}")
    return ShardKeys("default", queue, 0)


async def test_v1_backlog_refuses_the_start(aredis: aioredis.Redis) -> None:
    keys = await _v1_queue(aredis, "old")
    await aredis.zadd(keys.v1_index, {"1800000000": T0})
    with pytest.raises(layout.LayoutV1Data, match=r"default/old shard 0 .* drain it"):
        await layout.check(aredis)


async def test_v1_ready_jobs_refuse_the_start(aredis: aioredis.Redis) -> None:
    keys = await _v1_queue(aredis, "old")
    await aredis.lpush(keys.ready, "06h0b33othjqiok6d4dipm0")
    with pytest.raises(layout.LayoutV1Data):
        await layout.check(aredis)


async def test_an_empty_v1_queue_is_stamped_and_new_queues_are_v2(aredis: aioredis.Redis) -> None:
    await _v1_queue(aredis, "old")
    await layout.check(aredis)
    assert await aredis.hget(queue_meta_key("default", "old"), "layout") == b"2"
    store = Store(aredis)
    await store.shard_count("default", "new", create=True)
    await store.enqueue(ShardKeys("default", "new", 0), [spec(delay_ms=5_000)], T0)
    assert await aredis.hget(queue_meta_key("default", "new"), "layout") == b"2"
    await layout.check(aredis)  # v2 queues with jobs pass


async def test_record_compaction_is_checked(aredis: aioredis.Redis) -> None:
    # The session's redis-server is a managed one: it admits a record per listpack entry.
    limit = await layout.listpack_value_limit(aredis)
    assert limit is not None and limit >= layout.RECOMMENDED_LISTPACK_VALUE
