"""Every Lua script touches one slot: each runs on a real Redis Cluster.

Redis Cluster refuses a script whose declared keys span slots (CROSSSLOT) and
one that touches an undeclared key of another slot, so a script that builds a
key outside its shard's hash tag fails here. The control test shows the
cluster does refuse such a script.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio.cluster import RedisCluster

from delayq_server.store import JobState, LeaseRef, ShardKeys, Store, scripts
from delayq_server.store.jobs_admin import JobAdmin
from tests.support.cluster import ManagedCluster
from tests.support.seed import T0, Shard, spec


@pytest.fixture
async def cluster_store(redis_server: ManagedCluster) -> AsyncIterator[tuple[Store, set[str]]]:
    redis_server.flushall()
    client = RedisCluster.from_url(redis_server.seed_url, decode_responses=False)
    store = Store(client, bucket_width_ms=1000, completed_retention_ms=60_000)
    used: set[str] = set()
    run = store._run

    async def recording_run(name: str, keys: Any, args: Any, request_key: str = "") -> Any:
        used.add(name)
        return await run(name, keys, args, request_key)

    store._run = recording_run  # type: ignore[method-assign]
    yield store, used
    await client.aclose()


async def test_every_script_runs_on_the_cluster(cluster_store: tuple[Store, set[str]]) -> None:
    store, used = cluster_store
    admin = JobAdmin(store)
    for shard_no in range(3):  # three tags: most likely three different nodes
        shard = Shard(store, ShardKeys("ns", "slots", shard_no))
        k, now = shard.keys, T0
        await store.enqueue(k, [spec(delay_ms=1000, ttl_ms=5000, idempotency_key="i")], now)
        await store.enqueue(k, [spec(delay_ms=0) for _ in range(3)], now)
        assert (await store.promote(k, now_ms=now + 1000)).moved == 1
        a, b, c, d = await shard.claim(4, lease_ms=1000)
        assert await store.extend(k, a, 2000, now_ms=now) == now + 2000
        assert await store.ack(k, [a], now_ms=now) == [1]
        await store.nack(k, b, delay_ms=None, dead_letter=False, reason="r", now_ms=now)
        await store.nack(k, c, delay_ms=None, dead_letter=True, reason="r", now_ms=now)
        assert await store.release(k, [d], now_ms=now, unsent=frozenset([d.nonce])) == 1
        (e,) = await shard.claim(1, lease_ms=1000)
        assert len((await store.reap(k, now_ms=now + 5000)).reaped) == 1
        await store.get(k, b.job_id)
        assert await store.dead_action(k, "redrive", [c.job_id], 0) == 1
        dead = await shard.dead()
        assert await store.dead_action(k, "purge", [dead], 0) == 1
        await store.expire(k, now_ms=now + 60_000)
        assert isinstance(e, LeaseRef)
        later = await shard.scheduled(10_000)
        assert (await store.backlog_due(k, now)).within_minute >= 1  # ours, the retried one
        assert (await store.delete(k, later))[0] > 0
        assert (await store.shard_stats(k)).leased == 0  # one instant (lua/stats.lua)
        assert await store.own([k], "replica-a", 3000) == [True]
        assert await store.own([k], "replica-b", 3000) == [False]
        # Queue administration (issue 14).
        moved, _ = await store.enqueue(k, [spec(delay_ms=10_000)], now)
        out = await admin.reschedule(
            k, moved[0].job_id, delay_ms=20_000, due_ms=None, force=False, now_ms=now
        )
        assert out.due_ms == now + 20_000
        await admin.update(k, moved[0].job_id, payload=b"new", headers={"h": "v"})
        assert (await admin.purge(k, JobState.SCHEDULED))[0] >= 1
        await admin.retain(k, 1000, 1, now_ms=now + 60_000)
    await store.queues.set_paused("ns", "slots", 3, True)
    await store.queues.set_paused("ns", "slots", 3, False)
    assert await store.queues.drop("ns", "empty", 3) is None  # three empty shards
    assert "replica-a" in await store.heartbeat("replica-a", 3000)  # a global key
    assert used == set(scripts.NAMES), set(scripts.NAMES) - used


async def test_control_a_script_touching_another_slot_is_refused(
    redis_server: ManagedCluster,
) -> None:
    client = RedisCluster.from_url(redis_server.seed_url, decode_responses=False)
    try:
        script = client.register_script("return redis.call('GET', ARGV[1])")
        # Keys of two different hash tags hash to different slots.
        with pytest.raises(redis.exceptions.RedisError):
            await script(keys=["dq:{ns/a/0}:x"], args=["dq:{ns/b/7}:x"])
    finally:
        await client.aclose()
