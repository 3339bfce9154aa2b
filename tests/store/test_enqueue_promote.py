"""enqueue.lua and promote.lua: state before, call, state after, on a set clock."""

from __future__ import annotations

from typing import Any

import pytest

from delayq_server.store import JobState, Store
from tests.support.seed import T0, Shard, spec


async def test_delayed_job_goes_to_its_bucket_and_index(shard: Shard) -> None:
    job_id = await shard.scheduled(5_500)
    snap = await shard.snapshot()
    bucket = (T0 + 5_500) // 1000
    assert snap["ready"] == []
    assert snap["index"] == [(str(bucket).encode(), float(T0 + 5_500))]
    assert snap["buckets"] == {shard.keys.bucket(bucket): [(job_id.encode(), float(T0 + 5_500))]}
    assert await shard.state(job_id) == JobState.SCHEDULED


async def test_job_due_now_goes_straight_to_ready(shard: Shard) -> None:
    job_id = await shard.ready()
    snap = await shard.snapshot()
    assert snap["ready"] == [job_id.encode()]
    assert snap["index"] == []


async def test_due_time_in_the_past_is_due_now(store: Store, shard: Shard) -> None:
    (r,), now = await store.enqueue(shard.keys, [spec(due_at_ms=T0 - 60_000)], T0)
    assert r.due_ms == now == T0
    assert (await shard.snapshot())["ready"] == [r.job_id.encode()]


async def test_absolute_due_time_is_kept(store: Store, shard: Shard) -> None:
    (r,), _ = await store.enqueue(shard.keys, [spec(due_at_ms=T0 + 1234)], T0)
    assert r.due_ms == T0 + 1234


async def test_index_holds_the_earliest_due_of_each_bucket(shard: Shard) -> None:
    await shard.scheduled(1_900)
    await shard.scheduled(1_100)
    await shard.scheduled(1_500)
    snap = await shard.snapshot()
    assert snap["index"] == [(str((T0 + 1_100) // 1000).encode(), float(T0 + 1_100))]


@pytest.mark.parametrize(
    ("offset", "moved"),
    [(-1, 0), (0, 1), (1, 1)],
    ids=["one ms before due", "exactly due", "after due"],
)
async def test_promote_never_moves_a_job_early(
    store: Store, shard: Shard, offset: int, moved: int
) -> None:
    await shard.scheduled(2_000)
    res = await store.promote(shard.keys, 100, now_ms=T0 + 2_000 + offset)
    assert res.moved == moved
    assert len((await shard.snapshot())["ready"]) == moved


async def test_promote_reports_next_due_and_empties_buckets(store: Store, shard: Shard) -> None:
    a = await shard.scheduled(1_000)
    await shard.scheduled(3_000)
    res = await store.promote(shard.keys, 100, now_ms=T0 + 1_000)
    assert (res.moved, res.next_due_ms) == (1, T0 + 3_000)
    snap = await shard.snapshot()
    assert snap["ready"] == [a.encode()]
    assert len(snap["buckets"]) == 1 and len(snap["index"]) == 1


async def test_promote_is_bounded_and_keeps_due_order(store: Store, shard: Shard) -> None:
    ids = [await shard.scheduled(100 + i * 10) for i in range(25)]
    first = await store.promote(shard.keys, 10, now_ms=T0 + 10_000)
    assert first.moved == 10
    rest = await store.promote(shard.keys, 100, now_ms=T0 + 10_000)
    assert rest.moved == 15 and rest.next_due_ms is None
    # ready is consumed from the right: oldest due first
    ready = (await shard.snapshot())["ready"]
    assert [x.decode() for x in reversed(ready)] == ids


async def test_promoted_but_unclaimed_job_reads_as_ready(store: Store, shard: Shard) -> None:
    job_id = await shard.scheduled(1_000)
    shard.now = T0 + 1_000
    assert await shard.state(job_id) == JobState.READY


async def test_idempotency_key_returns_the_first_job(store: Store, shard: Shard) -> None:
    (a,), _ = await store.enqueue(shard.keys, [spec(idempotency_key="k1", delay_ms=500)], T0)
    (b,), _ = await store.enqueue(shard.keys, [spec(idempotency_key="k1", delay_ms=900)], T0)
    assert (b.job_id, b.due_ms, b.duplicate) == (a.job_id, T0 + 500, True)
    assert len((await shard.snapshot())["records"]) == 1


async def test_idempotency_window_expires(aredis: object, shard: Shard) -> None:
    store = Store(shard.store.redis, idempotency_window_ms=50)
    (a,), _ = await store.enqueue(shard.keys, [spec(idempotency_key="k")], T0)
    await shard.store.redis.pexpire(shard.keys.idempotency("k"), 1)
    while await shard.store.redis.exists(shard.keys.idempotency("k")):
        pass
    (b,), _ = await store.enqueue(shard.keys, [spec(idempotency_key="k")], T0)
    assert b.job_id != a.job_id and not b.duplicate


async def test_enqueue_publishes_wakeups(store: Store, shard: Shard) -> None:
    async with store.redis.pubsub() as ps:
        await ps.ssubscribe(shard.keys.channel)
        await ps.get_message(timeout=1)  # subscribe confirmation
        await shard.scheduled(5_000)  # first job: earliest due moved
        await shard.scheduled(9_000)  # later: no wake-up needed
        await shard.ready()  # ready list was empty
        await shard.ready()  # not empty any more: silent
        got = []
        while (m := await ps.get_message(timeout=0.5)) is not None:
            got.append(m["data"].decode())
    prefix = shard.keys.prefix
    assert got == [f"{prefix} due {T0 + 5_000}", f"{prefix} ready 1"]


async def test_headers_and_payload_round_trip(store: Store, shard: Shard) -> None:
    payload = bytes(range(256))
    job_id = await shard.ready(payload=payload, headers={"traceparent": "00-abc-01", "k": "ü"})
    rec, _ = await store.get(shard.keys, job_id)
    assert rec.payload == payload
    assert rec.headers == {"traceparent": "00-abc-01", "k": "ü"}
    assert (rec.attempts, rec.max_attempts, rec.created_ms, rec.due_ms) == (0, 3, T0, T0)


async def test_ttl_is_indexed(store: Store, shard: Shard) -> None:
    job_id = await shard.scheduled(1_000, ttl_ms=5_000)
    assert await store.redis.zscore(shard.keys.expiring, job_id) == T0 + 5_000


async def test_redis_time_is_the_default_clock(store: Store, shard: Shard) -> None:
    redis_now = await store.time_ms()
    (r,), now = await store.enqueue(shard.keys, [spec(delay_ms=0)])
    assert abs(now - redis_now) < 1_000 and r.due_ms == now


async def test_a_full_batch_is_stored_in_bounded_chunks(store: Store, shard: Shard) -> None:
    """1,000 jobs are 10 script calls of 100, not one long one that stalls Redis;
    results keep the input order across chunks."""
    from delayq_server.store.store import ENQUEUE_CHUNK

    calls: list[int] = []
    run = store._run

    async def counting_run(name: str, keys: Any, args: Any) -> Any:
        if name == "enqueue":
            calls.append(int(args[5]))  # ARGV[6]: jobs in this call
        return await run(name, keys, args)

    store._run = counting_run  # type: ignore[method-assign]
    jobs = [spec(delay_ms=1000 + i) for i in range(1000)]
    results, _ = await store.enqueue(shard.keys, jobs, T0)
    assert calls == [ENQUEUE_CHUNK] * (1000 // ENQUEUE_CHUNK)
    assert [r.job_id for r in results] == [j.job_id for j in jobs]
    assert [r.due_ms for r in results] == [T0 + 1000 + i for i in range(1000)]
