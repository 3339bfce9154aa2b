"""A stream's slots against a model, over seeded random sequences (real Redis, real
Dispatcher and stream; docs/decisions.md, "a stall check never frees the slot of a
lease that ran out").

The events a stream's slots hear come from several places: the client's answers
(through this replica or another), the reaper's "expired" messages (a task step here,
a pub/sub hop from another replica: they may come late and in any order) and the
stream's own stall checks. Whatever their order, two things must hold:

* a delivery whose lease ran out keeps its slot until the client answers for it
  (a frozen worker must not be handed its own retried job);
* once the client has answered for every delivery and every message has arrived, all
  slots are free within two stall checks (nothing is kept for good).

The stream's clock is a test clock (tests/support/streams.py), moved past a lease's
deadline before the reap that uses a Redis "now" past it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import pytest

from delayq_server.dispatcher import Dispatcher
from delayq_server.ids import LeaseToken
from delayq_server.store import AckOutcome, Claimed, LeaseRef, ShardKeys, Store
from delayq_server.stream import ConsumeStream
from tests.support.seed import spec
from tests.support.streams import Batch, Streams

SLOTS = 2
SEEDS = range(40)
STEPS = 30


@dataclass
class Model:
    """What the client and the test know of each delivery."""

    keys: ShardKeys
    live: dict[str, Claimed] = field(default_factory=dict)  # lease current, unanswered
    ran_out: dict[str, Claimed] = field(default_factory=dict)  # reaped, unanswered
    messages: list[str] = field(default_factory=list)  # "expired" nonces not yet delivered
    # Messages already pending at the last stall check: a whole stall period (10 s) has
    # passed for them by the next one, so they arrive before it (ms after the reap in
    # life; one that does not is lost, which these sequences leave out).
    overdue: list[str] = field(default_factory=list)


async def _deliver(store: Store, d: Dispatcher, gen: AsyncGenerator[Batch], m: Model) -> None:
    await store.enqueue(m.keys, [spec(backoff_ms=0, max_attempts=1_000)])
    d.board.fire(m.keys.tag)  # what the enqueue's "ready" event does
    for _, claimed in await asyncio.wait_for(anext(gen), 10):
        m.live[claimed.nonce] = claimed


async def _run_out(streams: Streams, s: ConsumeStream, m: Model, nonce: str) -> None:
    """Time passes beyond one lease's deadline; the reaper takes every lease due by then."""
    for lease in await streams.run_out(s, m.keys, m.live[nonce]):
        m.ran_out[lease.nonce] = m.live.pop(lease.nonce)
        m.messages.append(lease.nonce)


async def _answer_late(store: Store, d: Dispatcher, m: Model, nonce: str) -> None:
    claimed = m.ran_out.pop(nonce)
    (code,) = await store.ack(m.keys, [LeaseRef(claimed.job_id, nonce)])
    assert code != AckOutcome.ACKED
    await d.answered([LeaseToken(m.keys, claimed.job_id, nonce)])


async def _ack(store: Store, d: Dispatcher, m: Model, nonce: str, *, credit_lost: bool) -> None:
    claimed = m.live.pop(nonce)
    (code,) = await store.ack(m.keys, [LeaseRef(claimed.job_id, nonce)])
    assert code == AckOutcome.ACKED
    if not credit_lost:  # else: acked through a replica whose credit message was lost
        d.on_credit_nonces([nonce])


@pytest.mark.parametrize("seed", SEEDS)
async def test_slots_follow_answers_whatever_the_order_of_events(
    store: Store, streams: Streams, seed: int
) -> None:
    rng = random.Random(seed)
    m = Model(ShardKeys("default", f"slots-{seed}", 0))
    d = streams.dispatcher
    s, gen = streams.open(m.keys, slots=SLOTS)
    for _ in range(STEPS):
        ops = ["verify"]
        if s.credit > 0:
            ops += ["deliver"] * 3
        if m.live:
            ops += ["ack", "ack_credit_lost", "run_out", "run_out"]
        if m.ran_out:
            ops += ["answer_late"]
        if m.messages:
            ops += ["message", "message"]
        op = rng.choice(ops)
        if op == "deliver":
            await _deliver(store, d, gen, m)
        elif op == "verify":
            rng.shuffle(m.overdue)
            for nonce in m.overdue:
                m.messages.remove(nonce)
                d.on_expired_nonces([nonce])
            await s._verify_outstanding()
            m.overdue = list(m.messages)
        elif op == "message":
            nonce = m.messages.pop(rng.randrange(len(m.messages)))
            if nonce in m.overdue:
                m.overdue.remove(nonce)
            d.on_expired_nonces([nonce])
        elif op == "run_out":
            await _run_out(streams, s, m, rng.choice(sorted(m.live)))
        elif op == "answer_late":
            await _answer_late(store, d, m, rng.choice(sorted(m.ran_out)))
        else:
            await _ack(store, d, m, rng.choice(sorted(m.live)), credit_lost=op != "ack")
        # No message is ever lost here, so a lease that ran out keeps its slot until
        # its client answers.
        kept = set(s.outstanding)
        assert set(m.ran_out) <= kept, f"seed {seed}: slot of an unanswered expired lease freed"
        assert set(m.live) <= kept, f"seed {seed}: slot of a current lease freed"
        assert len(kept) <= SLOTS
    # The client answers for everything, every message arrives: all slots come back.
    for nonce in sorted(m.live):
        await _ack(store, d, m, nonce, credit_lost=False)
    for nonce in sorted(m.ran_out):
        await _answer_late(store, d, m, nonce)
    d.on_expired_nonces(m.messages)
    await s._verify_outstanding()
    await s._verify_outstanding()
    assert s.credit == SLOTS, f"seed {seed}: slots kept after every answer: {s.outstanding}"
