"""Background work stays bounded: janitor isolation, trims, bucket widths, idle loops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio as aioredis

from delayq_server import events
from delayq_server.store import ShardKeys, Store
from delayq_server.store import store as store_module
from delayq_server.timers.janitor import Janitor
from delayq_server.timers.manager import Timers
from tests.support.seed import KEYS, T0, Shard, spec


async def until(predicate: Callable[[], object], within: float = 15.0) -> None:
    """Polls an async or plain predicate; fails after ``timeout``."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {within}s")


# -- expire.lua -------------------------------------------------------------------


async def test_completed_trim_is_bounded_per_call(aredis: aioredis.Redis) -> None:
    store = Store(aredis, completed_retention_ms=1_000)
    await aredis.zadd(KEYS.done, {f"j{i}": T0 - 10_000 for i in range(450)})
    first = await store.expire(KEYS, limit=200, now_ms=T0)
    assert first.trimmed == 200 and first.next_ms == T0  # more pending: run again now
    second = await store.expire(KEYS, limit=200, now_ms=T0)
    assert second.trimmed == 200
    last = await store.expire(KEYS, limit=200, now_ms=T0)
    assert last.trimmed == 50 and last.next_ms is None
    assert await aredis.zcard(KEYS.done) == 0


async def test_expiring_a_ready_job_keeps_the_order_of_the_rest(
    store: Store, shard: Shard, aredis: aioredis.Redis
) -> None:
    oldest = await shard.ready(ttl_ms=1_000)  # at the consuming end (tail)
    rest = [await shard.ready(ttl_ms=60_000) for _ in range(5)]
    res = await store.expire(KEYS, now_ms=T0 + 2_000)
    assert res.expired == 1
    assert await aredis.lrange(KEYS.ready, 0, -1) == [i.encode() for i in reversed(rest)]
    assert oldest.encode() not in await aredis.lrange(KEYS.ready, 0, -1)


# -- bucket width per queue -------------------------------------------------------


async def test_bucket_width_flag_changes_nothing_stored(aredis: aioredis.Redis) -> None:
    keys = ShardKeys("default", "widths", 0)
    before = Store(aredis, bucket_width_ms=1_000)
    assert await before.shard_count("default", "widths", create=True) == 1
    job = spec(delay_ms=5_000)
    await before.enqueue(keys, [job], T0)
    # A restart with another --bucket-width: the queue keeps its own.
    after = Store(aredis, bucket_width_ms=60_000)
    assert await after.shard_count("default", "widths", create=False) == 1
    later = spec(delay_ms=7_000)
    await after.enqueue(keys, [later], T0)
    # Layout v2 places jobs by due time alone: both share the first bucket.
    assert await aredis.zscore(keys.bucket(T0 + 5_000), later.job_id) is not None
    # Deleting a job stored under the old flag finds its bucket: nothing stranded.
    await after.delete(keys, job.job_id)
    await after.delete(keys, later.job_id)
    assert await aredis.keys(keys.prefix + "bt:*") == []
    assert await aredis.zcard(keys.index) == 0
    assert int(await aredis.hget(keys.stats, "backlog") or 0) == 0


# -- janitor ----------------------------------------------------------------------


async def test_a_failing_shard_does_not_stop_the_janitor(aredis: aioredis.Redis) -> None:
    store = Store(aredis)
    broken, fine = ShardKeys("default", "broken", 0), ShardKeys("default", "fine", 0)
    await aredis.set(broken.expiring, "not a sorted set")  # every sweep of it fails
    (res,), _ = await store.enqueue(fine, [spec(delay_ms=0, ttl_ms=1)])
    janitor = Janitor(store, lambda: [broken, fine])  # the broken one listed first

    async def swept() -> bool:
        await janitor.tick()  # never raises: the failure stays with its shard
        return await _gone(aredis, fine, res.job_id)

    await until(swept)
    # The failing shard is backed off, not retried first on every tick...
    wait = janitor._due[broken] - time.monotonic()
    assert wait > 0
    janitor._due[broken] = 0.0
    await janitor.tick()
    # ...and each further failure waits longer.
    assert janitor._due[broken] - time.monotonic() > wait


async def _gone(aredis: aioredis.Redis, keys: ShardKeys, job_id: str) -> bool:
    return not await aredis.hexists(keys.record_group(job_id), job_id)


# -- idle loops -------------------------------------------------------------------


@pytest.fixture
async def wired(aredis: aioredis.Redis) -> AsyncIterator[tuple[Store, Timers]]:
    """Timers with a short idle time, fed by a real pub/sub listener."""
    store = Store(aredis)
    hub = events.EventHub()
    timers = Timers(store, hub, lambda keys, leases: None, idle_stop_s=0.3, refresh_s=0.1)
    listener = events.PubSubListener(aredis, hub, "t1", lambda kind, items: None)
    timers.on_known = listener.want
    listener.start()
    await asyncio.wait_for(listener.ready.wait(), 10)
    await timers.start()
    yield store, timers
    await timers.stop()
    await listener.stop()


async def test_idle_loops_stop_and_a_due_event_restarts_them(
    wired: tuple[Store, Timers], aredis: aioredis.Redis
) -> None:
    store, timers = wired
    keys = ShardKeys("default", "idle", 0)
    timers.ensure("default", "idle", await store.shard_count("default", "idle", create=True))
    assert timers.running(keys)
    await until(lambda: not timers.running(keys))  # nothing to do: stopped
    # Another replica schedules a job: its "due" event restarts the loops here.
    other = Store(aredis)
    job = spec(delay_ms=300)
    await other.enqueue(keys, [job])
    await until(lambda: timers.running(keys))
    await until(lambda: _ready_has(aredis, keys, job.job_id))  # promoted when due
    await until(lambda: not timers.running(keys))  # and idle again


async def test_a_lost_due_event_is_caught_by_the_refresh(
    wired: tuple[Store, Timers], aredis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, timers = wired
    keys = ShardKeys("default", "quiet", 0)
    timers.ensure("default", "quiet", await store.shard_count("default", "quiet", create=True))
    await until(lambda: not timers.running(keys))
    monkeypatch.setattr(store_module, "shard_channel", lambda keys: "dq:{nobody}:ch")
    job = spec(delay_ms=300)
    await Store(aredis).enqueue(keys, [job])  # its "due" event is lost
    await until(lambda: timers.running(keys))  # the refresh saw the backlog
    await until(lambda: _ready_has(aredis, keys, job.job_id))


async def _ready_has(aredis: aioredis.Redis, keys: ShardKeys, job_id: str) -> bool:
    return job_id.encode() in await aredis.lrange(keys.ready, 0, -1)


async def test_ready_removals_scan_from_the_consuming_end(
    store: Store, shard: Shard, redis_url: str
) -> None:
    """LREM -1: the ids that expire or are deleted while ready sit near the tail."""
    import redis as sync_redis

    job_id = await shard.ready()
    seen: list[list[str]] = []
    client = sync_redis.Redis.from_url(redis_url, decode_responses=True)
    with client.monitor() as monitor:  # type: ignore[no-untyped-call]
        await store.delete(KEYS, job_id)
        for entry in monitor.listen():
            command = entry["command"]
            if command.startswith("LREM"):
                seen.append(command.split())
                break
    client.close()
    assert seen == [["LREM", KEYS.ready, "-1", job_id]]
