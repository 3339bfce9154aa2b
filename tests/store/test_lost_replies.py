"""Lost replies: a script whose reply is lost and which the client re-sends runs once."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import cast

import pytest
import redis.asyncio as aioredis

from delayq_server.redis_client import connect as redis_client
from delayq_server.store import AckOutcome, JobState, LeaseRef, Store, UnknownJob, scripts
from tests.support.proxy import LossyProxy
from tests.support.seed import KEYS, T0, Shard, spec
from tests.support.servers import ManagedRedis


@pytest.fixture
async def lossy(redis_url: str, redis_server: ManagedRedis) -> AsyncIterator[LossyProxy]:
    proxy = await LossyProxy("127.0.0.1", redis_server.port).start()
    yield proxy
    await proxy.stop()


@pytest.fixture
async def lossy_store(lossy: LossyProxy) -> AsyncIterator[Store]:
    """A store whose client (the server's, retries included) talks through the proxy."""
    client = redis_client(lossy.url)
    store = Store(client, bucket_width_ms=1000, completed_retention_ms=0)
    await store.load_scripts()  # a NOSCRIPT reply must not be the one dropped
    yield store
    await client.aclose()


def sha(store: Store, name: str) -> bytes:
    """What the proxy matches on: EVALSHA's argument."""
    del store
    return hashlib.sha1(scripts.source(name).encode()).hexdigest().encode()


async def test_resent_claim_returns_the_same_leases(
    lossy: LossyProxy, lossy_store: Store, aredis: aioredis.Redis
) -> None:
    shard = Shard(lossy_store)
    ids = {await shard.ready() for _ in range(3)}
    lossy.drop_reply_to(sha(lossy_store, "claim"))
    claimed = await lossy_store.claim(KEYS, 10, 30_000, "s.1.0.", T0)
    assert lossy.dropped.is_set()  # the first run's reply was really lost
    assert {c.job_id for c in claimed} == ids
    # Nothing hidden: every leased job is one the stream got, with one attempt.
    leased = {cast(bytes, x).decode() for x in await aredis.zrange(KEYS.leased, 0, -1)}
    assert leased == ids
    for c in claimed:
        assert c.record.attempts == 1
        rec, _ = await lossy_store.get(KEYS, c.job_id)
        assert rec.state == JobState.LEASED and rec.nonce == c.nonce and rec.attempts == 1
    assert await aredis.llen(KEYS.ready) == 0


async def test_resent_enqueue_stores_no_duplicate(
    lossy: LossyProxy, lossy_store: Store, aredis: aioredis.Redis
) -> None:
    lossy.drop_reply_to(sha(lossy_store, "enqueue"))
    job = spec(delay_ms=0)
    (result,), _ = await lossy_store.enqueue(KEYS, [job], T0)
    assert lossy.dropped.is_set()
    assert result.job_id == job.job_id and not result.duplicate
    assert await aredis.lrange(KEYS.ready, 0, -1) == [job.job_id.encode()]
    assert await aredis.hget(KEYS.stats, "enqueued") == b"1"


async def test_resent_enqueue_answers_what_the_first_run_did(
    lossy: LossyProxy, lossy_store: Store, store: Store, aredis: aioredis.Redis
) -> None:
    """The replay entry keeps "now" and the duplicates only; the answer is rebuilt."""
    (first,), _ = await store.enqueue(KEYS, [spec(idempotency_key="k", delay_ms=700)], T0)
    jobs = [
        spec(delay_ms=0),
        spec(idempotency_key="k", delay_ms=5),  # a duplicate of `first`
        spec(delay_ms=2_500),
        spec(due_at_ms=T0 + 9_000),
        spec(due_at_ms=T0 - 9_000),  # in the past: due now
    ]
    lossy.drop_reply_to(sha(lossy_store, "enqueue"))
    results, _ = await lossy_store.enqueue(KEYS, jobs, T0 + 10)
    assert lossy.dropped.is_set()
    got = [(r.job_id, r.due_ms, r.duplicate) for r in results]
    assert got == [
        (jobs[0].job_id, T0 + 10, False),
        (first.job_id, T0 + 700, True),
        (jobs[2].job_id, T0 + 2_510, False),
        (jobs[3].job_id, T0 + 9_000, False),
        (jobs[4].job_id, T0 + 10, False),
    ]
    assert await aredis.hget(KEYS.stats, "enqueued") == b"5"
    entries = await aredis.keys(KEYS.prefix + "rq:*")
    assert entries  # the call's own entry (and `first`'s)
    for entry in entries:
        for value in await aredis.hvals(entry):  # one field per call of the batch
            assert len(cast(bytes, value)) < 60  # not the whole reply


async def test_a_resent_call_in_the_middle_of_a_batch_stores_no_duplicate(
    lossy: LossyProxy, lossy_store: Store, aredis: aioredis.Redis
) -> None:
    """A batch's 40 calls share one request key, a field each: the call whose reply
    was lost replays its own field, not a neighbour's."""
    lossy_store.enqueue_budget_us = 60_000_000  # the 40 calls of the cut, none cut by time
    jobs = [spec(delay_ms=1_000 + i) for i in range(1000)]
    lossy.drop_reply_to(jobs[510].job_id.encode())  # somewhere in the 21st call
    results, _ = await lossy_store.enqueue(KEYS, jobs, T0)
    assert lossy.dropped.is_set()
    assert [(r.job_id, r.due_ms, r.duplicate) for r in results] == [
        (j.job_id, T0 + 1_000 + i, False) for i, j in enumerate(jobs)
    ]
    assert await aredis.hget(KEYS.stats, "enqueued") == b"1000"
    assert await aredis.hget(KEYS.stats, "backlog") == b"1000"
    (entry,) = await aredis.keys(KEYS.prefix + "rq:*")  # one for the whole batch
    assert await aredis.hlen(entry) == 40
    assert 0 < await aredis.pttl(entry) <= 30_000


async def test_a_resent_call_cut_by_its_time_budget_answers_what_it_took(
    lossy: LossyProxy, lossy_store: Store, aredis: aioredis.Redis
) -> None:
    """A call that stopped at its Redis time budget keeps how many jobs it took in its
    replay entry: re-sent, it answers those (not all it was sent), and the rest still
    goes in the next call."""
    lossy_store.enqueue_budget_us = 1  # 4 jobs per call
    jobs = [spec(delay_ms=2_000), *(spec(delay_ms=3_000) for _ in range(9))]
    lossy.drop_reply_to(sha(lossy_store, "enqueue"))  # the first call's
    results, _ = await lossy_store.enqueue(KEYS, jobs, T0)
    assert lossy.dropped.is_set()
    assert [(r.job_id, r.due_ms, r.duplicate) for r in results] == [
        (j.job_id, T0 + j.delay_ms, False) for j in jobs if j.delay_ms is not None
    ]
    assert await aredis.hget(KEYS.stats, "enqueued") == b"10"
    assert await aredis.hget(KEYS.stats, "backlog") == b"10"
    (entry,) = await aredis.keys(KEYS.prefix + "rq:*")
    assert sorted(await aredis.hkeys(entry)) == [b"0", b"0.4", b"0.8"]  # three calls


async def test_resent_ack_answers_acked(lossy: LossyProxy, lossy_store: Store) -> None:
    shard = Shard(lossy_store)
    lease = await shard.leased()
    lossy.drop_reply_to(sha(lossy_store, "ack"))
    assert await lossy_store.ack(KEYS, [lease], T0) == [AckOutcome.ACKED]
    assert lossy.dropped.is_set()
    assert await lossy_store.ack(KEYS, [lease], T0) == [AckOutcome.UNKNOWN]  # a new call


async def test_resent_nack_retries_once(lossy: LossyProxy, lossy_store: Store) -> None:
    shard = Shard(lossy_store)
    lease = await shard.leased()
    lossy.drop_reply_to(sha(lossy_store, "nack"))
    out = await lossy_store.nack(
        KEYS, lease, delay_ms=5_000, dead_letter=False, reason="x", now_ms=T0
    )
    assert lossy.dropped.is_set()
    assert out.state == JobState.SCHEDULED and out.due_ms == T0 + 5_000
    counters = (await lossy_store.shard_stats(KEYS)).counters
    assert counters["retried"] == 1


async def test_replay_entries_expire(store: Store, aredis: aioredis.Redis) -> None:
    shard = Shard(store)
    await shard.ready()
    keys = await aredis.keys(KEYS.prefix + "rq:*")
    assert len(keys) == 1
    ttl = await aredis.pttl(keys[0])
    assert 0 < ttl <= 30_000


async def test_a_stale_lease_ref_is_not_replayed(store: Store) -> None:
    """Two separate calls with the same arguments are two calls (fresh request ids)."""
    shard = Shard(store)
    lease = await shard.leased()
    assert await store.ack(KEYS, [lease], T0) == [AckOutcome.ACKED]
    assert await store.ack(KEYS, [LeaseRef(lease.job_id, lease.nonce)], T0) == [AckOutcome.UNKNOWN]


async def test_calls_that_change_nothing_store_no_replay_entry(
    store: Store, aredis: aioredis.Redis
) -> None:
    """Refusals and empty sweeps leave Redis untouched (a re-run of them is harmless)."""
    ghost = LeaseRef("no-such-job", "n.1")
    with pytest.raises(UnknownJob):
        await store.nack(KEYS, ghost, delay_ms=None, dead_letter=False, reason="", now_ms=T0)
    with pytest.raises(UnknownJob):
        await store.extend(KEYS, ghost, 5_000, T0)
    assert await store.ack(KEYS, [ghost], T0) == [AckOutcome.UNKNOWN]
    assert await store.claim(KEYS, 10, 30_000, "s.1.0.", T0) == []
    await store.reap(KEYS, now_ms=T0)
    await store.promote(KEYS, now_ms=T0)
    await store.expire(KEYS, now_ms=T0)
    # This shard's keys only (its replay entries live under its prefix too): the
    # session's e2e server shares this Redis and may write its own keys meanwhile.
    assert await aredis.keys(KEYS.prefix + "*") == []


@pytest.mark.parametrize("lost", ["enqueue", "claim", "ack"])
async def test_a_resent_script_records_its_event_once(
    lossy: LossyProxy, lossy_store: Store, aredis: aioredis.Redis, lost: str
) -> None:
    lossy_store.events_maxlen = 1000
    shard = Shard(lossy_store)
    lossy.drop_reply_to(sha(lossy_store, lost))
    lease = await shard.leased()
    assert await lossy_store.ack(KEYS, [lease], T0) == [AckOutcome.ACKED]
    assert lossy.dropped.is_set()
    entries = cast(list[tuple[bytes, dict[bytes, bytes]]], await aredis.xrange(KEYS.events))
    kinds = [fields[b"e"] for _, fields in entries]
    assert kinds == [b"enqueued", b"delivered", b"acked"]
