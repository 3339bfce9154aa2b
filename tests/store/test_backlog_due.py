"""backlog.lua: the backlog by due time (next minute, hour, day, later) on a set clock."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from delayq_server.store import BacklogDue, ShardKeys, Store
from delayq_server.store import backlog as backlog_module
from tests.support.seed import T0, Shard

S, M, H, D = 1_000, 60_000, 3_600_000, 86_400_000
# Delays on both sides of every boundary, and one due now (ready: not backlog).
DELAYS = [0, 30 * S, M - 1, M, H - 1, H, D - 1, D, 10 * D]
WANT = BacklogDue(within_minute=2, within_hour=2, within_day=2, later=2, now_ms=T0)


async def _seed(shard: Shard) -> None:
    for delay in DELAYS:
        if delay:
            await shard.scheduled(delay)
        else:
            await shard.ready()


@pytest.mark.parametrize("width_ms", [1, 1_000, 7_000, 3_600_000])
async def test_counts_split_at_each_boundary_whatever_the_bucket_width(
    aredis: aioredis.Redis, width_ms: int
) -> None:
    """Wide buckets straddle the boundaries (ZCOUNT inside them); narrow ones don't."""
    store = Store(aredis, bucket_width_ms=width_ms)
    shard = Shard(store, ShardKeys("default", f"w{width_ms}", 0))
    await _seed(shard)
    assert await store.backlog_due(shard.keys, T0) == WANT


async def test_calls_continue_from_the_cursor(
    store: Store, shard: Shard, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(backlog_module, "BUCKETS_PER_CALL", 2)
    await _seed(shard)
    assert await store.backlog_due(shard.keys, T0) == WANT


async def test_overdue_jobs_not_yet_promoted_count_as_within_the_minute(
    store: Store, shard: Shard
) -> None:
    await shard.scheduled(5 * S)
    later = await store.backlog_due(shard.keys, T0 + 10 * S)
    assert later == BacklogDue(within_minute=1, now_ms=T0 + 10 * S)


async def test_empty_shard_counts_nothing(store: Store, shard: Shard) -> None:
    assert await store.backlog_due(shard.keys, T0) == BacklogDue(now_ms=T0)
