"""claim, ack, nack, extend, reap and release: the fenced lease lifecycle."""

from __future__ import annotations

import re
from typing import Any

import pytest

from delayq_server.store import (
    AckOutcome,
    Claimed,
    JobState,
    LeaseRef,
    ReleaseOutcome,
    StaleLease,
    Store,
    UnknownJob,
)
from tests.support.seed import T0, CallsAtOnce, Shard, spec


async def test_claim_leases_with_fresh_nonce_and_counts_the_attempt(
    store: Store, shard: Shard
) -> None:
    job_id = await shard.ready()
    claimed = await store.claim(shard.keys, 5, 30_000, "s.1.0.", T0)
    assert [c.job_id for c in claimed] == [job_id]
    c = claimed[0]
    assert re.fullmatch(r"s\.1\.0\.1\.[0-9a-f]{16}", c.nonce)
    assert c.record.attempts == 1 and c.lease_deadline_ms == T0 + 30_000
    assert c.record.state == JobState.LEASED and c.record.last_delivery_ms == T0
    assert await store.redis.zscore(shard.keys.leased, job_id) == T0 + 30_000


async def test_claimed_nonces_end_in_64_random_bits(store: Store, shard: Shard) -> None:
    """Issue 9: consecutive leases of one claim share no predictable suffix."""
    for _ in range(4):
        await shard.ready()
    claimed = await store.claim(shard.keys, 4, 30_000, "s.1.0.", T0)
    suffixes = [c.nonce.rsplit(".", 1)[1] for c in claimed]
    assert len(suffixes) == 4 and len(set(suffixes)) == 4
    assert all(re.fullmatch(r"[0-9a-f]{16}", x) for x in suffixes)
    # The stored nonce is what fences: the same lease with another random part is stale.
    c = claimed[0]
    forged = LeaseRef(c.job_id, c.nonce[:-1] + ("0" if c.nonce[-1] != "0" else "1"))
    assert await store.ack(shard.keys, [forged], T0) == [AckOutcome.STALE]


async def test_claim_takes_oldest_first_and_at_most_count(store: Store, shard: Shard) -> None:
    ids = [await shard.ready() for _ in range(5)]
    got = await shard.claim(3)
    assert [g.job_id for g in got] == ids[:3]
    assert len((await shard.snapshot())["ready"]) == 2


async def test_claim_drops_expired_jobs_and_counts_them(store: Store, shard: Shard) -> None:
    await shard.ready(ttl_ms=1_000)
    shard.now = T0 + 1_000
    assert await shard.claim() == []
    assert (await shard.snapshot())["records"] == []
    assert int(await store.redis.hget(shard.keys.stats, "expired") or 0) == 1


@pytest.mark.parametrize(
    ("nonce_of", "expected"),
    [("current", AckOutcome.ACKED), ("old", AckOutcome.STALE), ("none", AckOutcome.UNKNOWN)],
)
async def test_ack_outcomes(store: Store, shard: Shard, nonce_of: str, expected: int) -> None:
    lease = await shard.leased(lease_ms=1_000)
    ref = lease
    if nonce_of == "old":
        shard.now = T0 + 1_000
        await store.reap(shard.keys, now_ms=shard.now)  # lease expired -> retry backlog
        shard.now = T0 + 60_000
        await store.promote(shard.keys, now_ms=shard.now)
        (new,) = await shard.claim()
        assert new.job_id == lease.job_id and new.nonce != lease.nonce
    if nonce_of == "none":
        ref = LeaseRef("0000000000000000000000a", "t.1.0.1")
    assert await store.ack(shard.keys, [ref], shard.now) == [expected]


async def test_ack_deletes_or_keeps_a_completed_tombstone(store: Store, shard: Shard) -> None:
    lease = await shard.leased()
    assert await store.ack(shard.keys, [lease], T0) == [AckOutcome.ACKED]
    snap = await shard.snapshot()
    assert snap["records"] == [] and snap["leased"] == []

    keeping = Store(store.redis, completed_retention_ms=60_000)
    lease = await shard.leased()
    assert await keeping.ack(shard.keys, [lease], T0) == [AckOutcome.ACKED]
    rec, _ = await store.get(shard.keys, lease.job_id)
    assert rec.state == JobState.COMPLETED and rec.finish_ms == T0
    # Kept for the retention window, then trimmed by the janitor's sweep.
    await keeping.expire(shard.keys, now_ms=T0 + 59_999)
    assert (await store.get(shard.keys, lease.job_id))[0].state == JobState.COMPLETED
    await keeping.expire(shard.keys, now_ms=T0 + 60_000)
    with pytest.raises(UnknownJob):
        await store.get(shard.keys, lease.job_id)


async def test_second_ack_of_same_token_is_unknown(store: Store, shard: Shard) -> None:
    lease = await shard.leased()
    assert await store.ack(shard.keys, [lease, lease], T0) == [
        AckOutcome.ACKED,
        AckOutcome.UNKNOWN,
    ]


@pytest.mark.parametrize(
    ("attempt", "expected_delay"),
    [(1, 1_000), (2, 2_000), (3, 4_000), (7, 10_000)],
    ids=["first retry", "doubles", "doubles again", "capped"],
)
async def test_nack_follows_the_retry_policy(
    store: Store, shard: Shard, attempt: int, expected_delay: int
) -> None:
    job_id = await shard.ready(max_attempts=10, backoff_ms=1_000, backoff_max_ms=10_000)
    for i in range(attempt):
        (lease,) = await shard.claim(1)
        if i < attempt - 1:  # fail fast back to ready to reach the attempt under test
            await store.nack(shard.keys, lease, delay_ms=0, dead_letter=False, reason="", now_ms=T0)
    out = await store.nack(
        shard.keys, lease, delay_ms=None, dead_letter=False, reason="boom", now_ms=T0
    )
    assert (out.state, out.due_ms) == (JobState.SCHEDULED, T0 + expected_delay)
    rec, _ = await store.get(shard.keys, job_id)
    assert rec.last_error == "boom" and rec.attempts == attempt


async def test_nack_with_explicit_delay_and_zero_delay(store: Store, shard: Shard) -> None:
    lease = await shard.leased()
    out = await store.nack(
        shard.keys, lease, delay_ms=7_000, dead_letter=False, reason="", now_ms=T0
    )
    assert (out.state, out.due_ms) == (JobState.SCHEDULED, T0 + 7_000)
    lease = await shard.leased()
    out = await store.nack(shard.keys, lease, delay_ms=0, dead_letter=False, reason="", now_ms=T0)
    assert out.state == JobState.SCHEDULED  # due now: the contract says SCHEDULED or DEAD
    assert lease.job_id.encode() in (await shard.snapshot())["ready"]


async def test_jitter_shortens_but_never_lengthens(store: Store, shard: Shard) -> None:
    waits = []
    for _ in range(10):
        lease = await shard.leased(backoff_ms=10_000, jitter=0.5)
        out = await store.nack(
            shard.keys, lease, delay_ms=None, dead_letter=False, reason="", now_ms=T0
        )
        waits.append(out.due_ms - T0)
    assert all(5_000 <= w <= 10_000 for w in waits)
    assert len(set(waits)) > 1


async def test_nack_dead_letters_on_request_or_when_exhausted(store: Store, shard: Shard) -> None:
    lease = await shard.leased(max_attempts=5)
    out = await store.nack(shard.keys, lease, delay_ms=None, dead_letter=True, reason="poison")
    assert out.state == JobState.DEAD
    rec, _ = await store.get(shard.keys, lease.job_id)
    assert rec.last_error == "poison"

    lease = await shard.leased(max_attempts=1)
    out = await store.nack(shard.keys, lease, delay_ms=None, dead_letter=False, reason="")
    assert out.state == JobState.DEAD
    assert len((await shard.snapshot())["dead"]) == 2


async def test_stale_and_unknown_nack_and_extend_change_nothing(store: Store, shard: Shard) -> None:
    lease = await shard.leased()
    before = await shard.snapshot()
    stale = LeaseRef(lease.job_id, "t.9.9.9")
    with pytest.raises(StaleLease):
        await store.nack(shard.keys, stale, delay_ms=None, dead_letter=False, reason="")
    with pytest.raises(StaleLease):
        await store.extend(shard.keys, stale, 5_000)
    with pytest.raises(UnknownJob):
        await store.extend(shard.keys, LeaseRef("0000000000000000000000a", "x"), 5_000)
    assert await shard.snapshot() == before


async def test_extend_moves_the_deadline(store: Store, shard: Shard) -> None:
    lease = await shard.leased(lease_ms=1_000)
    deadline = await store.extend(shard.keys, lease, 9_000, now_ms=T0 + 500)
    assert deadline == T0 + 9_500
    assert await store.redis.zscore(shard.keys.leased, lease.job_id) == T0 + 9_500


async def test_reap_retries_with_backoff_then_dead_letters(store: Store, shard: Shard) -> None:
    lease = await shard.leased(lease_ms=1_000, max_attempts=2, backoff_ms=500)
    assert (await store.reap(shard.keys, now_ms=T0 + 999)).reaped == []
    res = await store.reap(shard.keys, now_ms=T0 + 1_000)
    assert res.reaped == [lease] and res.next_deadline_ms is None
    rec, _ = await store.get(shard.keys, lease.job_id)
    assert (rec.state, rec.due_ms, rec.last_error) == (
        JobState.SCHEDULED,
        T0 + 1_500,
        "lease expired",
    )
    shard.now = T0 + 1_500
    await store.promote(shard.keys, now_ms=shard.now)
    (second,) = await shard.claim(lease_ms=1_000)
    res = await store.reap(shard.keys, now_ms=T0 + 2_500)
    assert res.reaped == [second]
    rec, _ = await store.get(shard.keys, lease.job_id)
    assert rec.state == JobState.DEAD and rec.attempts == 2


async def test_release_returns_current_leases_to_the_front(store: Store, shard: Shard) -> None:
    held = await shard.leased()
    await shard.ready()  # waiting behind the released one
    stale = LeaseRef(held.job_id, "t.0.0.0")
    assert await store.release(shard.keys, [stale], T0) == 0
    assert await store.release(shard.keys, [held], T0) == 1
    (first,) = await shard.claim(1)
    assert first.job_id == held.job_id  # released job is next out
    rec, _ = await store.get(shard.keys, held.job_id)
    assert rec.attempts == 2


async def test_release_on_final_attempt_dead_letters(store: Store, shard: Shard) -> None:
    held = await shard.leased(max_attempts=1)
    assert await store.release(shard.keys, [held], T0) == 0
    assert await shard.state(held.job_id) == JobState.DEAD


async def test_held_tells_current_leases_from_gone_ones(store: Store, shard: Shard) -> None:
    kept, acked = await shard.leased(), await shard.leased()
    await store.ack(shard.keys, [acked])
    stale = LeaseRef(kept.job_id, "t.0.0.0")
    assert await store.held(shard.keys, [kept, acked, stale]) == [True, False, False]


async def test_release_of_an_unsent_claim_does_not_count_the_attempt(
    store: Store, shard: Shard
) -> None:
    held = await shard.leased()
    assert await store.release(shard.keys, [held], T0, unsent=frozenset({held.nonce})) == 1
    rec, _ = await store.get(shard.keys, held.job_id)
    assert (rec.state, rec.attempts) == (JobState.READY, 0)


async def test_give_back_is_uncounted_per_lease_and_never_dead_letters(
    store: Store, shard: Shard
) -> None:
    last = await shard.leased(max_attempts=1)  # on its final attempt
    held = await shard.leased()
    acked = await shard.leased()
    await store.ack(shard.keys, [acked])
    waiting = await shard.ready()
    stale = LeaseRef(held.job_id, "t.0.0.0")
    unknown = LeaseRef("06h03hkqjpgep0lubf6r2to", "t.0.0.0")
    codes = await store.give_back(shard.keys, [last, held, stale, acked, unknown], T0)
    R = ReleaseOutcome
    assert codes == [R.RELEASED, R.RELEASED, R.STALE, R.UNKNOWN, R.UNKNOWN]
    for lease in (last, held):
        rec, _ = await store.get(shard.keys, lease.job_id)
        assert (rec.state, rec.attempts, rec.nonce) == (JobState.READY, 0, "")
    assert (await shard.snapshot())["leased"] == []
    # Given back to the consuming end: next out, ahead of what was already waiting.
    got = [c.job_id for c in await shard.claim(3)]
    assert set(got[:2]) == {last.job_id, held.job_id} and got[2] == waiting
    # A repeat (its reply was lost) changes nothing: the token is no longer current.
    assert await store.give_back(shard.keys, [held], T0) == [R.STALE]


async def test_claims_acks_and_releases_are_bounded_per_script_call(
    store: Store, shard: Shard
) -> None:
    """A burst of leases is many short script calls, never one that stalls Redis
    (docs/design.md: every script is bounded); results keep the input order."""
    from delayq_server.store.store import ACK_CHUNK, CLAIM_LIMIT, RELEASE_CHUNK

    sizes: dict[str, list[int]] = {"claim": [], "ack": [], "release": []}
    run = store._run

    async def counting_run(name: str, keys: Any, args: Any, request_key: str = "") -> Any:
        out = await run(name, keys, args, request_key)
        if name == "claim":
            sizes[name].append((len(out) - 1) // 3)  # {now, then id, nonce, record each}
        elif name in sizes:
            sizes[name].append(len(out))  # one outcome code per lease
        return out

    store._run = counting_run  # type: ignore[method-assign]
    n = 1000
    await store.enqueue(shard.keys, [spec(delay_ms=0) for _ in range(n)], T0)
    claimed = await store.claim(shard.keys, n, 30_000, "s.1.0.", T0)
    assert len(claimed) == CLAIM_LIMIT == sizes["claim"][0]
    while len(claimed) < n:
        claimed += await store.claim(shard.keys, CLAIM_LIMIT, 30_000, "s.1.0.", T0)
    leases = [LeaseRef(c.job_id, c.nonce) for c in claimed]
    half = n // 2
    acked = await store.ack(shard.keys, leases[:half], T0)
    assert acked == [AckOutcome.ACKED] * half
    assert sizes["ack"] == [ACK_CHUNK] * (half // ACK_CHUNK) + (
        [half % ACK_CHUNK] if half % ACK_CHUNK else []
    )
    released = await store.give_back(shard.keys, leases[half:], T0)
    assert released == [ReleaseOutcome.RELEASED] * half
    assert sizes["release"] == [RELEASE_CHUNK] * (half // RELEASE_CHUNK)


async def test_ack_chunks_of_distinct_jobs_go_out_together(store: Store, shard: Shard) -> None:
    """An Ack of many leases is several bounded calls sent together; a request that
    names a job twice goes one call after another, and its first listing wins."""
    await store.enqueue(shard.keys, [spec(delay_ms=0) for _ in range(400)], T0)
    claimed: list[Claimed] = []
    while len(claimed) < 400:
        claimed += await store.claim(shard.keys, 400, 30_000, "s.1.0.", T0)
    leases = [LeaseRef(c.job_id, c.nonce) for c in claimed]
    calls = CallsAtOnce(store, "ack")
    assert await store.ack(shard.keys, leases[:300], T0) == [AckOutcome.ACKED] * 300
    assert calls.peak > 1
    calls = CallsAtOnce(store, "ack")
    twice = [*leases[300:], leases[300]]  # 100 leases, then the first again: 2 chunks
    out = await store.ack(shard.keys, twice, T0)
    assert calls.peak == 1
    assert out[0] == AckOutcome.ACKED and out[-1] != AckOutcome.ACKED
