"""enqueue.lua and promote.lua: state before, call, state after, on a set clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

from delayq_server import ids
from delayq_server.store import JobState, Store
from delayq_server.store.jobs_admin import JobAdmin
from tests.support.seed import T0, CallsAtOnce, Shard, spec


async def test_delayed_job_goes_to_its_bucket_and_index(shard: Shard) -> None:
    job_id = await shard.scheduled(5_500)
    snap = await shard.snapshot()
    start = T0 + 5_500  # the first bucket starts at the first due time
    assert snap["ready"] == []
    assert snap["index"] == [(str(start).encode(), float(start))]
    assert snap["buckets"] == {shard.keys.bucket(start): [(job_id.encode(), float(start))]}
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


async def test_an_earlier_job_moves_the_first_bucket_start_down(shard: Shard) -> None:
    await shard.scheduled(1_900)
    await shard.scheduled(1_100)
    await shard.scheduled(1_500)
    snap = await shard.snapshot()
    assert snap["index"] == [(str(T0 + 1_100).encode(), float(T0 + 1_100))]
    assert [len(v) for v in snap["buckets"].values()] == [3]


async def _bucket_sizes(shard: Shard) -> list[int]:
    snap = await shard.snapshot()
    starts = [int(m) for m, _ in snap["index"]]
    assert all(int(m) == sc for m, sc in snap["index"])
    sizes = []
    ends: list[int | None] = [*starts[1:], None]
    for start, nxt in zip(starts, ends[: len(starts)], strict=True):
        jobs = snap["buckets"][shard.keys.bucket(start)]
        # Every job sits in the bucket whose range holds its due time.
        assert all(start <= due and (nxt is None or due < nxt) for _, due in jobs)
        sizes.append(len(jobs))
    assert len(snap["buckets"]) == len(starts)  # no bucket outside the index
    return sizes


async def test_buckets_split_past_100_jobs_and_stay_listpack(store: Store, shard: Shard) -> None:
    rng = random.Random(3)
    offsets = [rng.randrange(1_000, 30 * 86_400_000) for _ in range(1_000)]
    for start in range(0, 1_000, 100):
        await store.enqueue(
            shard.keys, [spec(delay_ms=d) for d in offsets[start : start + 100]], T0
        )
    sizes = await _bucket_sizes(shard)
    assert sum(sizes) == 1_000 and max(sizes) <= 100 and len(sizes) <= 25
    for key in await store.redis.keys(shard.keys.prefix + "bt:*"):
        assert await store.redis.object("encoding", key) == b"listpack"
    # Promotion in due order across every bucket, emptying them all.
    moved = 0
    while (res := await store.promote(shard.keys, 500, now_ms=T0 + 31 * 86_400_000)).moved:
        moved += res.moved
    assert moved == 1_000 and res.next_due_ms is None
    ready = [x.decode() for x in reversed((await shard.snapshot())["ready"])]
    dues = [(await store.get(shard.keys, i))[0].due_ms for i in ready]
    assert dues == sorted(dues)
    assert await _bucket_sizes(shard) == []


async def test_jobs_in_due_order_fill_buckets(store: Store, shard: Shard) -> None:
    for i in range(250):
        await shard.scheduled(1_000 + i)
    assert await _bucket_sizes(shard) == [100, 100, 50]


async def test_jobs_due_at_one_instant_share_a_bucket(store: Store, shard: Shard) -> None:
    await store.enqueue(shard.keys, [spec(delay_ms=5_000) for _ in range(150)], T0)
    assert await _bucket_sizes(shard) == [150]
    res = await store.promote(shard.keys, 500, now_ms=T0 + 5_000)
    assert (res.moved, res.next_due_ms) == (150, None)


async def test_runs_of_one_due_time_in_a_call_keep_every_bucket_whole(
    store: Store, shard: Shard
) -> None:
    """enqueue.lua remembers the bucket of the last due time within a call; runs of
    equal due times, interleaved with others, splitting buckets, still land each job
    in the bucket whose range holds it, and only single-instant buckets pass 100."""
    rng = random.Random(11)
    dues: list[int] = []
    while len(dues) < 1_500:
        dues += [rng.randrange(1_000, 1_400)] * rng.choice([1, 3, 40, 130])
    for start in range(0, len(dues), 100):
        await store.enqueue(shard.keys, [spec(delay_ms=d) for d in dues[start : start + 100]], T0)
    sizes = await _bucket_sizes(shard)
    assert sum(sizes) == len(dues)
    snap = await shard.snapshot()
    for jobs in snap["buckets"].values():
        if len(jobs) > 100:
            assert len({due for _, due in jobs}) == 1


async def test_a_call_of_one_due_time_looks_its_bucket_up_once(quiet_redis: Any) -> None:
    """100 jobs of one delay in one call: one bucket lookup and size read, not one per
    job (plus three split probes per job once the bucket is full of that instant),
    and the jobs after the first go into their bucket in one ZADD, not one each."""
    store = Store(quiet_redis, bucket_width_ms=1000, completed_retention_ms=0)
    store.enqueue_budget_us = 60_000_000  # one call, however loaded the machine
    shard = Shard(store)
    await store.enqueue(shard.keys, [spec(delay_ms=5_000) for _ in range(100)], T0)
    await store.redis.config_resetstat()
    await store.enqueue(shard.keys, [spec(delay_ms=5_000) for _ in range(100)], T0)
    stats = await store.redis.info("commandstats")
    calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
    assert calls["zadd"] == 2
    assert calls.get("zcard", 0) <= 2 and calls.get("zrange", 0) <= 6
    assert await _bucket_sizes(shard) == [200]


async def test_delete_and_nack_find_jobs_after_splits(store: Store, shard: Shard) -> None:
    ids = [await shard.scheduled(1_000 + (i * 7919) % 5_000) for i in range(300)]
    for job_id in ids[::2]:
        await store.delete(shard.keys, job_id)
    sizes = await _bucket_sizes(shard)
    assert sum(sizes) == 150
    assert int(await store.redis.hget(shard.keys.stats, "backlog") or 0) == 150


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


async def test_an_enqueue_call_reads_redis_time_once(quiet_redis: Any) -> None:
    """The time budget's start is also the call's "now": one TIME per call, as before
    the budget (a unary Enqueue is one call of one job)."""
    store = Store(quiet_redis, completed_retention_ms=0)
    shard = Shard(store)
    await store.enqueue(shard.keys, [spec(delay_ms=5_000)])  # scripts warm
    await store.redis.config_resetstat()
    (r,), now = await store.enqueue(shard.keys, [spec(delay_ms=5_000)])
    stats = await store.redis.info("commandstats")
    assert int(stats["cmdstat_time"]["calls"]) == 1
    assert r.due_ms == now + 5_000


def _counting_enqueue_calls(store: Store, budget_us: int = 60_000_000) -> list[int]:
    """Jobs per enqueue script call (ARGV[6]), recorded as the calls go out. The
    script's Redis time budget is set out of reach (a loaded machine would otherwise
    cut a call now and then) unless the test is about it."""
    store.enqueue_budget_us = budget_us
    calls: list[int] = []
    run = store._run

    async def counting_run(name: str, keys: Any, args: Any, request_key: str = "") -> Any:
        if name == "enqueue":
            calls.append(int(args[5]))
        return await run(name, keys, args, request_key)

    store._run = counting_run  # type: ignore[method-assign]
    return calls


async def test_a_full_batch_is_stored_in_bounded_chunks(store: Store, shard: Shard) -> None:
    """1,000 jobs of one delay are 10 script calls of 100, not one long one that
    stalls Redis; results keep the input order across chunks."""
    from delayq_server.store.chunks import ENQUEUE_CHUNK

    calls = _counting_enqueue_calls(store)
    jobs = [spec(delay_ms=60_000) for _ in range(1000)]
    results, _ = await store.enqueue(shard.keys, jobs, T0)
    assert calls == [ENQUEUE_CHUNK] * (1000 // ENQUEUE_CHUNK)
    assert [r.job_id for r in results] == [j.job_id for j in jobs]
    assert {r.due_ms for r in results} == {T0 + 60_000}


async def test_a_call_holds_few_distinct_due_times(store: Store, shard: Shard) -> None:
    """Each new due time in a call costs Redis a bucket lookup (and sometimes a split)
    on top of the job's own writes: 100 jobs with 100 due times over 30 days held
    Redis 2.4-2.6 ms per call (bench/enqueue_calls.py), over the 2 ms bound. So a call
    takes at most ENQUEUE_DUE_TIMES of them; jobs sharing their neighbour's due time
    (one delay, or one absolute time) and jobs due at once do not count."""
    from delayq_server.store.chunks import ENQUEUE_CHUNK, ENQUEUE_DUE_TIMES

    calls = _counting_enqueue_calls(store)
    spread = [spec(delay_ms=1000 + i) for i in range(1000)]
    results, _ = await store.enqueue(shard.keys, spread, T0)
    assert calls == [ENQUEUE_DUE_TIMES] * (1000 // ENQUEUE_DUE_TIMES)
    assert [r.job_id for r in results] == [j.job_id for j in spread]
    assert [r.due_ms for r in results] == [T0 + 1000 + i for i in range(1000)]

    calls.clear()  # runs of 10 jobs per due time: 25 runs would be 250 jobs
    runs = [spec(delay_ms=5_000 + i // 10) for i in range(1000)]
    await store.enqueue(shard.keys, runs, T0)
    assert calls == [ENQUEUE_CHUNK] * 10

    calls.clear()  # absolute due times count the same way
    at = [spec(due_at_ms=T0 + 9_000 + i) for i in range(60)]
    await store.enqueue(shard.keys, at, T0)
    assert calls == [ENQUEUE_DUE_TIMES, ENQUEUE_DUE_TIMES, 10]

    calls.clear()  # due at once: the ready list, no bucket
    await store.enqueue(shard.keys, [spec(delay_ms=0) for _ in range(200)], T0)
    assert calls == [ENQUEUE_CHUNK] * 2
    assert await store.redis.llen(shard.keys.ready) == 200


async def test_a_call_stops_at_its_redis_time_budget(store: Store, shard: Shard) -> None:
    """enqueue.lua stops once its call has taken the budget of Redis' own time (checked
    every 4 jobs) and the store sends the rest: with a budget of 1 µs, every call takes
    4 jobs. Each job is stored once, in order, with its due time."""
    calls = _counting_enqueue_calls(store, budget_us=1)
    jobs = [spec(delay_ms=60_000) for _ in range(100)]
    results, _ = await store.enqueue(shard.keys, jobs, T0)
    assert calls == list(range(100, 0, -4))  # jobs sent: each call stored 4
    assert [r.job_id for r in results] == [j.job_id for j in jobs]
    assert {r.due_ms for r in results} == {T0 + 60_000}
    assert await store.redis.hget(shard.keys.stats, "enqueued") == b"100"
    assert await store.redis.hget(shard.keys.stats, "backlog") == b"100"
    assert sum(await _bucket_sizes(shard)) == 100  # each job in the backlog once


async def _max_enqueue_calls_at_once(store: Store, shard: Shard, jobs: list[Any]) -> int:
    calls = CallsAtOnce(store, "enqueue")
    results, _ = await store.enqueue(shard.keys, jobs, T0)
    assert [r.job_id for r in results] == [j.job_id for j in jobs]
    return calls.peak


async def test_chunks_of_delayed_jobs_go_out_together(store: Store, shard: Shard) -> None:
    """Several at once, but not all 40: each holds a Redis connection (and its buffers)."""
    from delayq_server.store.chunks import CHUNKS_AT_ONCE

    jobs = [spec(delay_ms=1000 + i) for i in range(1000)]
    assert 1 < await _max_enqueue_calls_at_once(store, shard, jobs) <= CHUNKS_AT_ONCE
    assert int(await store.redis.hget(shard.keys.stats, "backlog") or 0) == 1000


@pytest.mark.parametrize(
    "odd_one",
    [
        spec(delay_ms=0),
        spec(delay_ms=5_000, idempotency_key="k"),
        spec(due_at_ms=T0 + 5_000),
    ],
    ids=["due now: ready order", "idempotency key: first wins", "due time: maybe due now"],
)
async def test_chunks_that_order_matters_for_go_one_after_another(
    store: Store, shard: Shard, odd_one: Any
) -> None:
    jobs = [*(spec(delay_ms=1000 + i) for i in range(999)), odd_one]
    assert await _max_enqueue_calls_at_once(store, shard, jobs) == 1


async def test_claim_takes_due_jobs_from_the_backlog_itself(store: Store, shard: Shard) -> None:
    heads: list[tuple[int | None, int]] = []
    store.on_backlog_head = lambda keys, due, now: heads.append((due, now))
    a = await shard.scheduled(1_000)
    b = await shard.scheduled(1_000)
    c = await shard.scheduled(3_000)
    # Not early: one ms before, nothing; the next due time is reported.
    assert await store.claim(shard.keys, 10, 30_000, "t.1.0.", T0 + 999) == []
    assert heads[-1] == (T0 + 1_000, T0 + 999)
    # At the due time the claim promotes and leases in one call, as many as it asks.
    (first,) = await store.claim(shard.keys, 1, 30_000, "t.1.1.", T0 + 1_000)
    assert first.job_id in (a, b) and heads[-1] == (T0 + 1_000, T0 + 1_000)
    rest = await store.claim(shard.keys, 10, 30_000, "t.1.2.", T0 + 5_000)
    assert {x.job_id for x in rest} == {a, b, c} - {first.job_id}
    assert heads.pop() == (None, T0 + 5_000)
    snap = await shard.snapshot()
    assert snap["ready"] == [] and snap["index"] == [] and snap["buckets"] == {}
    assert int(await store.redis.hget(shard.keys.stats, "backlog") or 0) == 0


async def test_admin_listing_pages_through_split_buckets(store: Store, shard: Shard) -> None:
    rng = random.Random(5)
    offsets = [rng.randrange(1_000, 86_400_000) for _ in range(450)]
    for start in range(0, 450, 150):
        await store.enqueue(
            shard.keys, [spec(delay_ms=d) for d in offsets[start : start + 150]], T0
        )
    assert len(await _bucket_sizes(shard)) > 4
    admin = JobAdmin(store)
    lo, hi = T0 + 3_600_000, T0 + 20 * 3_600_000  # a window cutting through buckets
    seen: list[str] = []
    bucket, offset, more = 0, 0, True
    while more:
        page = await admin.scheduled_page(shard.keys, lo, hi, bucket, offset, 37)
        seen += page.ids
        bucket, offset, more = page.bucket, page.offset, page.more
    dues = [(await store.get(shard.keys, i))[0].due_ms for i in seen]
    assert dues == sorted(dues) and len(set(seen)) == len(seen)
    assert len(seen) == sum(1 for d in offsets if lo <= T0 + d < hi)
    hist = await admin.backlog_buckets(shard.keys)
    assert sum(n for _, n in hist) == 450 and [d for d, _ in hist] == sorted(d for d, _ in hist)


async def test_jobs_enqueued_together_share_few_record_groups(store: Store, shard: Shard) -> None:
    """1,000 ids made in one go span one or two 16 ms windows, so their records land
    in at most 64 of the shard's 1,024 groups (warm hashes in a big backlog), where
    random group bits would touch ~640 (docs/decisions.md, record groups)."""
    jobs = [spec(delay_ms=60_000) for _ in range(1000)]
    await store.enqueue(shard.keys, jobs, shard.now)
    groups = await store.redis.keys(shard.keys.prefix + "r:*")
    assert 32 <= len(groups) <= 64
    assert sum([await store.redis.hlen(g) for g in groups]) == 1000


async def test_ids_with_random_group_bits_are_still_found(store: Store, shard: Shard) -> None:
    """Ids made before the group bits followed time stay where their bits say."""
    old = [spec(delay_ms=60_000) for _ in range(50)]
    for i, job in enumerate(old):
        job.job_id = ids.encode_id(T0 // 2, random.Random(i).getrandbits(64))
    await store.enqueue(shard.keys, old, shard.now)
    for job in old:
        rec, _ = await store.get(shard.keys, job.job_id)
        assert rec is not None and rec.payload == job.payload
