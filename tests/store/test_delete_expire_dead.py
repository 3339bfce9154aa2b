"""delete.lua, expire.lua and dead.lua."""

from __future__ import annotations

import pytest

from delayq_server.store import JobState, Store, UnknownJob
from tests.support.seed import T0, Shard


@pytest.mark.parametrize("state", ["scheduled", "promoted", "ready", "leased", "dead"])
async def test_delete_in_each_state_leaves_nothing(store: Store, shard: Shard, state: str) -> None:
    empty = await shard.snapshot()
    if state == "scheduled":
        job_id, expected = await shard.scheduled(5_000), JobState.SCHEDULED
    elif state == "promoted":
        job_id, expected = await shard.scheduled(5_000), JobState.READY
        await store.promote(shard.keys, now_ms=T0 + 5_000)
    elif state == "ready":
        job_id, expected = await shard.ready(), JobState.READY
    elif state == "leased":
        job_id, expected = (await shard.leased()).job_id, JobState.LEASED
    else:
        job_id, expected = await shard.dead(), JobState.DEAD
    was, nonce = await store.delete(shard.keys, job_id)
    assert was == expected and bool(nonce) == (expected == JobState.LEASED)
    assert await shard.snapshot() == empty
    with pytest.raises(UnknownJob):
        await store.delete(shard.keys, job_id)


async def test_deleted_leased_job_cannot_be_acked(store: Store, shard: Shard) -> None:
    lease = await shard.leased()
    await store.delete(shard.keys, lease.job_id)
    assert await store.ack(shard.keys, [lease]) == [3]


async def test_expire_drops_jobs_in_any_state_and_counts(store: Store, shard: Shard) -> None:
    await shard.scheduled(1_000, ttl_ms=2_000)
    await shard.ready(ttl_ms=2_000)
    await shard.leased(ttl_ms=2_000)
    keep = await shard.ready(ttl_ms=9_000)
    early = await store.expire(shard.keys, now_ms=T0 + 1_999)
    assert (early.expired, early.next_ms) == (0, T0 + 2_000)
    due = await store.expire(shard.keys, now_ms=T0 + 2_000)
    assert (due.expired, due.next_ms) == (3, T0 + 9_000)
    snap = await shard.snapshot()
    assert snap["records"] == [keep]
    assert int(await store.redis.hget(shard.keys.stats, "expired") or 0) == 3


async def test_redrive_resets_attempts_and_purge_deletes(store: Store, shard: Shard) -> None:
    a, b, c = await shard.dead(), await shard.dead(), await shard.dead()
    assert await store.dead_action(shard.keys, "redrive", [a], 0) == 1
    rec, _ = await store.get(shard.keys, a)
    assert (rec.state, rec.attempts) == (JobState.READY, 0)
    assert await store.dead_action(shard.keys, "purge", [], 10) == 2
    with pytest.raises(UnknownJob):
        await store.get(shard.keys, b)
    with pytest.raises(UnknownJob):
        await store.get(shard.keys, c)
    page = await store.dead_page(shard.keys, 0, 10)
    assert page == []
