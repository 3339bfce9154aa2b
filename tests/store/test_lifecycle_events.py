"""Lifecycle events: each transition script XADDs its event, in the same script, only when on."""

from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis

from delayq_server.store import LeaseRef, Store
from delayq_server.store.lifecycle import LifecycleEvent, decode_event
from tests.support.seed import T0, Shard, spec


@pytest.fixture
def recording(aredis: aioredis.Redis) -> Shard:
    return Shard(Store(aredis, bucket_width_ms=1000, events_maxlen=10_000))


async def events(shard: Shard) -> list[LifecycleEvent]:
    entries: Any = await shard.store.redis.xrange(shard.keys.events)
    return [decode_event(fields) for _, fields in entries]


def kinds(evs: list[LifecycleEvent]) -> list[tuple[str, int]]:
    return [(e.kind, e.attempt) for e in evs]


async def test_off_by_default_nothing_is_recorded(shard: Shard) -> None:
    lease = await shard.leased()
    await shard.store.ack(shard.keys, [lease], T0)
    assert await shard.store.redis.exists(shard.keys.events) == 0


async def test_enqueue_claim_ack_each_record_once_with_times(recording: Shard) -> None:
    s = recording
    (job,), _ = await s.store.enqueue(s.keys, [spec(delay_ms=500)], T0)
    dup = spec(delay_ms=500, idempotency_key="k")
    await s.store.enqueue(s.keys, [dup], T0)
    await s.store.enqueue(s.keys, [dup], T0)  # a duplicate stores nothing: no event
    await s.store.promote(s.keys, now_ms=T0 + 500)
    claimed = await s.store.claim(s.keys, 1, 30_000, "t.1.0.", T0 + 520)
    await s.store.ack(s.keys, [LeaseRef(claimed[0].job_id, claimed[0].nonce)], T0 + 600)

    evs = await events(s)
    assert kinds(evs) == [("enqueued", 0), ("enqueued", 0), ("delivered", 1), ("acked", 1)]
    delivered, acked = evs[2], evs[3]
    assert delivered.job_id == job.job_id
    assert (delivered.time_ms, delivered.due_ms, delivered.created_ms) == (T0 + 520, T0 + 500, T0)
    assert (acked.time_ms, acked.created_ms) == (T0 + 600, T0)


async def test_nack_retry_then_dead_letter_carry_reason_and_attempt(recording: Shard) -> None:
    s = recording
    lease = await s.leased(max_attempts=2, backoff_ms=1000)
    await s.store.nack(s.keys, lease, delay_ms=None, dead_letter=False, reason="boom", now_ms=T0)
    s.now = T0 + 1000
    await s.store.promote(s.keys, now_ms=s.now)
    (again,) = await s.claim(1)
    await s.store.nack(
        s.keys, again, delay_ms=None, dead_letter=False, reason="boom2", now_ms=s.now
    )

    evs = await events(s)
    assert kinds(evs) == [
        ("enqueued", 0), ("delivered", 1), ("nacked", 1), ("delivered", 2), ("dead", 2),
    ]  # fmt: skip
    assert (evs[2].reason, evs[2].due_ms) == ("boom", T0 + 1000)
    assert evs[4].reason == "boom2"


async def test_reap_release_expire_delete_redrive_purge(recording: Shard) -> None:
    s = recording
    reaped = await s.leased(lease_ms=1000)
    released = await s.leased()
    expiring = await s.scheduled(60_000, ttl_ms=5_000)
    deleted = await s.scheduled(60_000)
    dead = await s.dead()
    purged = await s.dead()
    await s.store.reap(s.keys, now_ms=T0 + 1000)
    await s.store.release(s.keys, [released], T0 + 1000, unsent=frozenset({released.nonce}))
    await s.store.expire(s.keys, now_ms=T0 + 5_000)
    await s.store.delete(s.keys, deleted)
    await s.store.dead_action(s.keys, "redrive", [dead], 10)
    await s.store.dead_action(s.keys, "purge", [purged], 10)

    tail = [(e.kind, e.job_id, e.reason) for e in (await events(s))[-6:]]
    assert tail == [
        ("nacked", reaped.job_id, "lease expired"),
        ("released", released.job_id, "unsent"),
        ("expired", expiring, "ttl"),
        ("deleted", deleted, ""),
        ("redriven", dead, ""),
        ("deleted", purged, "purged"),
    ]
    # The release gave the unsent delivery's attempt back.
    assert [e.attempt for e in await events(s) if e.kind == "released"] == [0]


async def test_the_stream_stays_bounded(aredis: aioredis.Redis) -> None:
    s = Shard(Store(aredis, events_maxlen=50))
    for _ in range(10):
        await s.store.enqueue(s.keys, [spec(delay_ms=1000) for _ in range(100)], T0)
    # MAXLEN ~ trims whole stream nodes (100 entries each), never below 50.
    assert 50 <= await aredis.xlen(s.keys.events) <= 250
