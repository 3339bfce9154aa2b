"""A stream's stall check and the slots of leases that ran out (docs/decisions.md,
"a stall check never frees the slot of a lease that ran out").

Found by the benchmark's SIGSTOP run: one time in three the frozen worker's stream
got its job back and the live worker waited a second 30 s lease. The stream's stall
check (every STALL_CHECK_S, 10 s) verified its lease in the instant between the
reap and the reaper's "expired" message, saw it no longer held, and gave the slot
back as if the credit message had been lost; the stream then claimed the retried job.
"""

from __future__ import annotations

from delayq_server.dispatcher import Dispatcher
from delayq_server.ids import LeaseToken
from delayq_server.store import Claimed, LeaseRef, ShardKeys, Store
from delayq_server.stream import ConsumeStream
from tests.support.seed import KEYS, spec
from tests.support.streams import Streams


async def _hold(store: Store, streams: Streams) -> tuple[Dispatcher, ConsumeStream, Claimed]:
    """A one-slot stream holding one fresh lease of a job with attempts left."""
    stream, deliveries = streams.open(KEYS, slots=1)
    await store.enqueue(KEYS, [spec(backoff_ms=0, max_attempts=5)])
    ((_, claimed),) = await anext(deliveries)
    assert stream.credit == 0
    return streams.dispatcher, stream, claimed


async def _run_out(streams: Streams, stream: ConsumeStream, claimed: Claimed) -> None:
    reaped = await streams.run_out(stream, KEYS, claimed)
    assert [r.nonce for r in reaped] == [claimed.nonce]


async def test_a_stall_check_between_a_reap_and_its_message_keeps_the_slot(
    store: Store, streams: Streams
) -> None:
    dispatcher, stream, claimed = await _hold(store, streams)
    await _run_out(streams, stream, claimed)
    # The reaper's "expired" message has not reached the stream yet (a task step on
    # this replica, a pub/sub hop from another one) when the stall check looks.
    await stream._verify_outstanding()
    assert stream.credit == 0  # the retried job must not go back to the frozen stream
    dispatcher.on_expired_nonces([claimed.nonce])
    await stream._verify_outstanding()
    assert stream.credit == 0
    # The worker wakes up and answers, late: that frees the slot.
    await dispatcher.answered([LeaseToken(KEYS, claimed.job_id, claimed.nonce)])
    assert stream.credit == 1


async def test_a_lease_settled_before_its_deadline_frees_its_slot_at_the_stall_check(
    store: Store, streams: Streams
) -> None:
    _, stream, claimed = await _hold(store, streams)
    # Acked through another replica whose credit message was lost.
    await store.ack(KEYS, [LeaseRef(claimed.job_id, claimed.nonce)])
    await stream._verify_outstanding()
    assert stream.credit == 1


async def test_a_lease_gone_past_its_deadline_without_a_message_frees_at_the_next_check(
    store: Store, streams: Streams
) -> None:
    # Reaped (or settled after an extension) and the message that says so was lost:
    # one whole stall period is left for it to arrive, then the slot comes back.
    _, stream, claimed = await _hold(store, streams)
    await _run_out(streams, stream, claimed)
    await stream._verify_outstanding()
    assert stream.credit == 0
    await stream._verify_outstanding()
    assert stream.credit == 1


async def test_the_reaper_here_marks_its_streams_before_any_other_task_runs(
    store: Store, streams: Streams
) -> None:
    dispatcher, stream, claimed = await _hold(store, streams)
    dispatcher.on_reaped(KEYS, [LeaseRef(claimed.job_id, claimed.nonce)])
    assert stream.outstanding[claimed.nonce].expired  # no await in between


async def test_a_late_answer_that_beats_the_reapers_message_frees_the_slot(
    store: Store, streams: Streams
) -> None:
    # Reaper on one replica, the client's stale Ack on another: the two messages race
    # to the stream's replica, and the answer may come first. The client answers for
    # a delivery once; a slot kept until then would be kept for good.
    dispatcher, stream, claimed = await _hold(store, streams)
    await _run_out(streams, stream, claimed)
    await dispatcher.answered([LeaseToken(KEYS, claimed.job_id, claimed.nonce)])
    assert stream.credit == 1
    dispatcher.on_expired_nonces([claimed.nonce])  # the reaper's message, late
    assert stream.credit == 1


async def test_an_answer_naming_another_job_frees_nothing(store: Store, streams: Streams) -> None:
    dispatcher, stream, claimed = await _hold(store, streams)
    await _run_out(streams, stream, claimed)
    forged = LeaseToken(KEYS, claimed.job_id + "x", claimed.nonce)  # another job's id
    await dispatcher.answered([forged])
    dispatcher.on_expired_nonces([claimed.nonce])
    await dispatcher.answered([forged])
    assert stream.credit == 0


async def test_an_answer_from_an_older_replica_frees_only_a_lease_that_ran_out(
    store: Store, streams: Streams
) -> None:
    # Replicas before the shard travelled with the answer send "nonce|job id".
    dispatcher, stream, claimed = await _hold(store, streams)
    dispatcher.on_answered([f"{claimed.nonce}|{claimed.job_id}"])
    assert stream.credit == 0  # current, as far as this replica knows
    dispatcher.on_expired_nonces([claimed.nonce])
    dispatcher.on_answered([f"{claimed.nonce}|{claimed.job_id}"])
    assert stream.credit == 1


async def test_an_answer_for_the_nonce_under_another_shard_frees_nothing(
    store: Store, streams: Streams
) -> None:
    # Found by tests/security/test_fuzz.py: tenant A acked B's real nonce and job id
    # under A's own namespace; Redis answered UNKNOWN (no such job in A's shard) and
    # the answer freed the slot of B's current lease. The answer must name the shard too.
    dispatcher, stream, claimed = await _hold(store, streams)
    other = ShardKeys("other-tenant", KEYS.queue, KEYS.shard)
    await dispatcher.answered([LeaseToken(other, claimed.job_id, claimed.nonce)])
    assert stream.credit == 0
    await dispatcher.answered([LeaseToken(KEYS, claimed.job_id, claimed.nonce)])
    assert stream.credit == 1
