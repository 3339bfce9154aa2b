"""One Consume stream: claims ready jobs within its credit and yields them.

A stream holds at most ``max_outstanding`` un-acked deliveries. It claims only
from shards the replica's ready board hints may hold jobs, and waits idle
(woken one at a time by the board) when none of its shards is hinted
(docs/decisions.md, wake-ups).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from delayq_server.store import Claimed, LeaseRef, ShardKeys
from delayq_server.store.store import CLAIM_LIMIT

if TYPE_CHECKING:
    from delayq_server.dispatcher import Dispatcher

IDLE_FALLBACK_S = 30.0  # re-check for work when no wake-up came (last resort)
# With no credit and no credit message for this long, re-verify outstanding
# leases against Redis (covers credit lost with a pub/sub message, or a lease
# dropped by TTL expiry).
STALL_CHECK_S = 10.0
RELEASE_COOLDOWN_S = 0.5  # credit of a released delivery comes back after this


@dataclass(slots=True)
class Outstanding:
    keys: ShardKeys
    job_id: str
    # Monotonic time by which the lease may have run out: taken before the claim
    # call, so never later than the Redis deadline (extensions only move that later).
    may_expire_at: float = 0.0
    sent: bool = False  # False between claim and the stream write
    expired: bool = False  # the lease ran out; the client has not answered for it yet
    # A stall check found it gone past its deadline before the reaper's "expired"
    # message came: the next check frees it if the message never does.
    unexplained: bool = False


class ConsumeStream:
    """State of one open Consume stream on this replica."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        seq: str,
        shards_by_queue: list[list[ShardKeys]],
        max_outstanding: int,
        lease_ms: int,
        max_batch: int,
        release_grace_ms: int = 0,
    ) -> None:
        self._d = dispatcher
        self.seq = seq
        self._queues = shards_by_queue
        self._max_outstanding = max_outstanding
        self._lease_ms = lease_ms
        self._max_batch = max_batch
        self.release_grace_ms = release_grace_ms
        self.outstanding: dict[str, Outstanding] = {}  # nonce -> lease
        self.wake = asyncio.Event()
        self._claims = itertools.count()
        self._rotation = itertools.count()
        self._woken_for: str | None = None  # the tag whose event woke us, claimed first
        self._cooling = 0  # released deliveries whose credit has not come back yet
        self.closing = False

    @property
    def credit(self) -> int:
        held = len(self.outstanding) + self._cooling
        return max(0, min(self._max_outstanding - held, self._max_batch))

    def wake_up(self, tag: str | None = None) -> None:
        """Called by the ready board (one idle stream per event) and by credit."""
        if tag is not None:
            self._woken_for = tag
        self.wake.set()

    def credit_back(self, nonce: str) -> None:
        if self.outstanding.pop(nonce, None) is not None:
            self.wake.set()

    def lease_expired(self, nonce: str) -> None:
        """The lease ran out: the slot stays taken until the client answers for it."""
        o = self.outstanding.get(nonce)
        if o is not None:
            o.expired = True

    def answered(self, nonce: str, job_id: str, tag: str | None) -> None:
        """The client answered, late, for a delivery Redis refused the token of (STALE
        or UNKNOWN in the delivery's own shard, so its lease is not current). It answers
        once: the slot frees even when the reaper's "expired" message has not come yet
        (they race from two replicas). The job and shard must be the delivery's: the
        same nonce under another namespace is answered UNKNOWN there and frees nothing.
        A message without the shard (``tag`` None, an older replica) frees only a
        lease known to have run out, as before."""
        o = self.outstanding.get(nonce)
        if o is None or o.job_id != job_id:
            return
        if o.keys.tag != tag and not (tag is None and o.expired):
            return
        del self.outstanding[nonce]
        self.wake.set()

    def given_back(self, nonce: str) -> None:
        """A delivery the client released unstarted. Its credit returns after a
        short cooldown: a client gives back mostly as its stream closes, and a
        stream the server has not yet seen close must not lease the same job
        again at once (docs/decisions.md, release)."""
        if self.outstanding.pop(nonce, None) is None:
            return
        self._cooling += 1

        def cooled() -> None:
            self._cooling -= 1
            self.wake.set()

        asyncio.get_running_loop().call_later(RELEASE_COOLDOWN_S, cooled)

    def keep(self, nonce: str) -> None:
        """An extended lease of a closed stream in its grace is no longer released by it."""
        if self.closing:
            self.outstanding.pop(nonce, None)

    def mark_sent(self, nonces: Iterable[str]) -> None:
        """Handed to gRPC from here on: the client may have it even if the write
        is interrupted, so its attempt counts when the stream closes."""
        for nonce in nonces:
            o = self.outstanding.get(nonce)
            if o is not None:
                o.sent = True

    def close(self) -> None:
        self.closing = True
        self.wake.set()

    @property
    def tags(self) -> Iterable[str]:
        return (k.tag for shards in self._queues for k in shards)

    async def _claim(self, keys: ShardKeys, count: int, prefix: str) -> list[Claimed]:
        """One claim script call that survives the stream being cancelled mid-call.

        If the stream is cancelled while the script runs, its leases would be
        lost until they expire; instead they are released (uncounted) as soon
        as the call returns.
        """
        task = asyncio.ensure_future(self._d.store.claim(keys, count, self._lease_ms, prefix))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._d.release_orphaned(keys, task)
            raise

    def _order(self, shards: list[ShardKeys], hinted: dict[str, int]) -> list[ShardKeys]:
        """A queue's hinted shards: the one whose event woke us first, then in
        rotation, so every shard of the queue gets its turn."""
        cands = [k for k in shards if k.tag in hinted]
        if not cands:
            return cands
        start = next(self._rotation) % len(cands)
        cands = cands[start:] + cands[:start]
        first = [k for k in cands if k.tag == self._woken_for]
        return first + [k for k in cands if k.tag != self._woken_for]

    async def _claim_round(self, hinted: dict[str, int]) -> list[tuple[ShardKeys, Claimed]]:
        """Claims in priority order (a later queue only gets the credit left over),
        from ``hinted`` shards only; a short claim clears the hint, a full one passes
        the wake-up on to another idle stream."""
        got: list[tuple[ShardKeys, Claimed]] = []
        board = self._d.board
        budget = self.credit
        for shards in self._queues:
            if budget <= 0:
                break
            for keys in self._order(shards, hinted):
                if budget <= 0:
                    break
                prefix = f"{self._d.server_id}.{self.seq}.{next(self._claims)}."
                asked = min(budget, CLAIM_LIMIT)  # what one claim call can take
                may_expire_at = time.monotonic() + self._lease_ms / 1000
                claimed = await self._claim(keys, asked, prefix)
                if len(claimed) < asked:
                    board.drained(keys.tag, hinted[keys.tag])
                else:
                    board.pass_on(keys.tag)  # maybe more: let another stream help
                if claimed:
                    self._d.on_leased(keys, claimed[0].lease_deadline_ms)
                for c in claimed:
                    self.outstanding[c.nonce] = Outstanding(keys, c.job_id, may_expire_at)
                    got.append((keys, c))
                budget -= len(claimed)
        self._woken_for = None
        return got

    async def deliveries(self) -> AsyncIterator[list[tuple[ShardKeys, Claimed]]]:
        """Yields batches of fresh leases until the stream is closed."""
        board = self._d.board
        first = True
        while not self.closing:
            self.wake.clear()
            if len(self.outstanding) + self._cooling >= self._max_outstanding:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STALL_CHECK_S):
                        await self.wake.wait()
                if not self.wake.is_set():
                    await self._verify_outstanding()
                continue
            tags = list(self.tags)
            hinted = board.hinted(tags)
            if not first and self._woken_for is None:
                # Credit came back. Take turns: when other streams wait idle for
                # a hinted shard, wake the longest-waiting one and queue behind it,
                # so a busy stream does not take every job (fair spread).
                turn = next((t for t in hinted if board.has_idle(t)), None)
                if turn is not None:
                    board.pass_on(turn)
                    board.go_idle(self, tags, force=True)
                    await self._wait_idle(tags)
                    continue
            first = False
            woken = self._woken_for is not None
            # Nothing hinted (credit came back after a delivery): no claim round,
            # straight to idle.
            batch = await self._claim_round(hinted) if hinted else []
            self._woken_for = None
            if batch:
                # Handed to gRPC from here on: the client may have it even if
                # the write is interrupted, so its attempt counts.
                for _, c in batch:
                    o = self.outstanding.get(c.nonce)
                    if o is not None:
                        o.sent = True
                yield batch
                continue
            if board.go_idle(self, tags, front=woken):  # refused: hinted meanwhile
                await self._wait_idle(tags)

    async def _wait_idle(self, tags: list[str]) -> None:
        """Waits registered on the ready board until woken (or the fallback)."""
        board = self._d.board
        try:
            # asyncio.timeout, not wait_for: no task per wait (a stream goes idle
            # once per due time at a steady rate, issue 12).
            async with asyncio.timeout(self._d.idle_fallback_s):
                await self.wake.wait()
        except TimeoutError:
            board.hint_all(tags)  # last resort: an event may have been lost
        finally:
            board.stop_idle(self)

    async def _verify_outstanding(self) -> None:
        """Drops leases this stream no longer holds (credit lost with a pub/sub message,
        or a lease dropped by TTL expiry): one pipelined read per shard.

        A lease gone before its deadline was settled: its slot is free. One gone
        after it may have run out, and the reaper's "expired" message (a task step
        here, a pub/sub hop from another replica) may still be on its way: a slot
        freed now would hand the retried job straight back to a frozen worker
        (docs/decisions.md). It is freed at the next check if no message came.
        """
        by_shard: dict[ShardKeys, list[LeaseRef]] = defaultdict(list)
        for nonce, o in self.outstanding.items():
            if not o.expired:  # those wait for the client (Dispatcher.on_reaped)
                by_shard[o.keys].append(LeaseRef(o.job_id, nonce))
        for keys, leases in by_shard.items():
            held = await self._d.store.held(keys, leases)
            checked = time.monotonic()  # after the read: what it saw was gone by then
            for lease, ok in zip(leases, held, strict=True):
                gone = self.outstanding.get(lease.nonce)
                if ok or gone is None or gone.expired:
                    continue
                if checked < gone.may_expire_at or gone.unexplained:
                    del self.outstanding[lease.nonce]
                else:
                    gone.unexplained = True

    async def release(self) -> int:
        by_shard: dict[ShardKeys, list[LeaseRef]] = defaultdict(list)
        unsent = frozenset(n for n, o in self.outstanding.items() if not o.sent)
        for nonce, o in self.outstanding.items():
            by_shard[o.keys].append(LeaseRef(o.job_id, nonce))
        self.outstanding.clear()
        released = 0
        for keys, leases in by_shard.items():
            n = await self._d.store.release(keys, leases, unsent=unsent)
            self._d.on_released(keys, n)
            released += n
        return released
