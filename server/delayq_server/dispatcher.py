"""Per-stream delivery: claims ready jobs for a Consume stream within its credit.

A stream holds at most ``max_outstanding`` un-acked deliveries. Credit comes
back when a delivery is acked or nacked (through any replica: the lease nonce
names the server and stream, and other replicas publish the credit to us) or
when the reaper takes back an expired lease. When the stream ends, its
current leases go back to ready: at once, or after the stream's release grace
unless they are settled or extended meanwhile (docs/decisions.md, release grace).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from delayq_server import events
from delayq_server.ids import LeaseToken
from delayq_server.store import Claimed, LeaseRef, ShardKeys, Store
from delayq_server.store.keys import server_channel

log = logging.getLogger(__name__)

IDLE_FALLBACK_S = 30.0  # re-check for work when no wake-up came (last resort)
# With no credit and no credit message for this long, re-verify outstanding
# leases against Redis (covers credit lost with a pub/sub message, or a lease
# dropped by TTL expiry).
STALL_CHECK_S = 10.0


@dataclass(slots=True)
class Outstanding:
    keys: ShardKeys
    job_id: str
    sent: bool = False  # False between claim and the stream write


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
        self.closing = False

    def credit_back(self, nonce: str) -> None:
        if self.outstanding.pop(nonce, None) is not None:
            self.wake.set()

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

    async def _claim_round(self) -> list[tuple[ShardKeys, Claimed]]:
        """Claims in priority order: a later queue only gets the credit left over."""
        got: list[tuple[ShardKeys, Claimed]] = []
        budget = min(self._max_outstanding - len(self.outstanding), self._max_batch)
        for shards in self._queues:
            if budget <= 0:
                break
            start = next(self._rotation) % len(shards)
            for keys in shards[start:] + shards[:start]:
                if budget <= 0:
                    break
                prefix = f"{self._d.server_id}.{self.seq}.{next(self._claims)}."
                claimed = await self._claim(keys, budget, prefix)
                if claimed:
                    self._d.on_leased(keys, claimed[0].lease_deadline_ms)
                for c in claimed:
                    self.outstanding[c.nonce] = Outstanding(keys, c.job_id)
                    got.append((keys, c))
                budget -= len(claimed)
        return got

    async def deliveries(self) -> AsyncIterator[list[tuple[ShardKeys, Claimed]]]:
        """Yields batches of fresh leases until the stream is closed."""
        while not self.closing:
            self.wake.clear()
            if len(self.outstanding) >= self._max_outstanding:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), STALL_CHECK_S)
                if not self.wake.is_set():
                    await self._verify_outstanding()
                continue
            batch = await self._claim_round()
            if batch:
                # Handed to gRPC from here on: the client may have it even if
                # the write is interrupted, so its attempt counts.
                for _, c in batch:
                    o = self.outstanding.get(c.nonce)
                    if o is not None:
                        o.sent = True
                yield batch
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self._d.idle_fallback_s)

    async def _verify_outstanding(self) -> None:
        """Drops leases this stream no longer holds (credit lost with a pub/sub message,
        or a lease dropped by TTL expiry): one pipelined read per shard."""
        by_shard: dict[ShardKeys, list[LeaseRef]] = defaultdict(list)
        for nonce, o in self.outstanding.items():
            by_shard[o.keys].append(LeaseRef(o.job_id, nonce))
        for keys, leases in by_shard.items():
            held = await self._d.store.held(keys, leases)
            for lease, ok in zip(leases, held, strict=True):
                if not ok:
                    self.outstanding.pop(lease.nonce, None)

    async def release(self) -> int:
        by_shard: dict[ShardKeys, list[LeaseRef]] = defaultdict(list)
        unsent = frozenset(n for n, o in self.outstanding.items() if not o.sent)
        for nonce, o in self.outstanding.items():
            by_shard[o.keys].append(LeaseRef(o.job_id, nonce))
        self.outstanding.clear()
        released = 0
        for keys, leases in by_shard.items():
            released += await self._d.store.release(keys, leases, unsent=unsent)
        return released


class Dispatcher:
    """Registry of this replica's streams and the credit paths into them."""

    def __init__(
        self,
        store: Store,
        hub: events.EventHub,
        server_id: str,
        on_leased: Callable[[ShardKeys, int], None] = lambda keys, deadline_ms: None,
        idle_fallback_s: float = IDLE_FALLBACK_S,
    ) -> None:
        self.store = store
        self.idle_fallback_s = idle_fallback_s
        self.on_leased = on_leased  # tells this replica's reaper about new deadlines
        self.hub = hub
        self.server_id = server_id
        self._streams: dict[str, ConsumeStream] = {}
        self._seq = itertools.count(1)
        self._releases: set[asyncio.Task[int]] = set()
        self._lingering: set[asyncio.Task[int]] = set()  # closed streams in their grace
        self._background: set[asyncio.Task[None]] = set()

    def open(
        self,
        shards_by_queue: list[list[ShardKeys]],
        max_outstanding: int,
        lease_ms: int,
        max_batch: int,
        release_grace_ms: int = 0,
    ) -> ConsumeStream:
        seq = format(next(self._seq), "x")
        stream = ConsumeStream(
            self, seq, shards_by_queue, max_outstanding, lease_ms, max_batch, release_grace_ms
        )
        self._streams[seq] = stream
        for tag in stream.tags:
            self.hub.subscribe(events.READY, tag, stream.wake)
        return stream

    def close(self, stream: ConsumeStream) -> None:
        """Unregisters and releases the stream's leases in a task that outlives cancellation.

        With a release grace the stream stays registered (so acks, nacks, releases
        and extensions through any replica still take its leases off the list) and
        what is left is released when the grace ends.
        """
        stream.closing = True
        for tag in stream.tags:
            self.hub.unsubscribe(events.READY, tag, stream.wake)
        if stream.release_grace_ms > 0 and stream.outstanding:
            linger = asyncio.create_task(self._linger(stream), name=f"linger {stream.seq}")
            self._lingering.add(linger)
            linger.add_done_callback(self._lingering.discard)
            return
        self._streams.pop(stream.seq, None)
        task = asyncio.create_task(stream.release(), name=f"release {stream.seq}")
        self._releases.add(task)
        task.add_done_callback(self._release_done)

    async def _linger(self, stream: ConsumeStream) -> int:
        try:
            await asyncio.sleep(stream.release_grace_ms / 1000)
        finally:
            self._streams.pop(stream.seq, None)
        # Shielded: a server stop after the grace must not cut a release in half.
        task = asyncio.create_task(stream.release(), name=f"release {stream.seq}")
        self._releases.add(task)
        task.add_done_callback(self._release_done)
        return await asyncio.shield(task)

    def _release_done(self, task: asyncio.Task[int]) -> None:
        self._releases.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("releasing leases of a closed stream failed: %s", task.exception())

    def release_orphaned(self, keys: ShardKeys, claim: asyncio.Future[list[Claimed]]) -> None:
        """Releases, uncounted, whatever a cancelled stream's in-flight claim leased."""

        async def release() -> int:
            claimed = await claim
            leases = [LeaseRef(c.job_id, c.nonce) for c in claimed]
            unsent = frozenset(c.nonce for c in claimed)
            return await self.store.release(keys, leases, unsent=unsent) if leases else 0

        task = asyncio.create_task(release(), name="release orphaned claim")
        self._releases.add(task)
        task.add_done_callback(self._release_done)

    def wake_all(self) -> None:
        for stream in self._streams.values():
            stream.wake.set()

    def close_all(self) -> None:
        for stream in list(self._streams.values()):
            stream.close()

    async def drain_releases(self) -> None:
        """Finishes releases under way. Streams still in their grace keep their
        leases, which run out normally: a worker that reconnects to another
        replica can still settle or extend them."""
        for linger in list(self._lingering):
            linger.cancel()
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)

    # -- credit -------------------------------------------------------------------

    def _stream_of(self, nonce: str) -> ConsumeStream | None:
        parts = nonce.split(".")
        if len(parts) >= 2 and parts[0] == self.server_id:
            return self._streams.get(parts[1])
        return None

    def on_credit_nonces(self, nonces: list[str]) -> None:
        """Credit for nonces of our own streams (local acks or another replica's message)."""
        for nonce in nonces:
            stream = self._stream_of(nonce)
            if stream is not None:
                stream.credit_back(nonce)

    def on_keep_nonces(self, nonces: list[str]) -> None:
        """Extended leases: a closed stream in its grace must not release them."""
        for nonce in nonces:
            stream = self._stream_of(nonce)
            if stream is not None:
                stream.keep(nonce)

    async def credit(self, tokens: list[LeaseToken]) -> None:
        """Returns credit for finished leases to whichever replica holds the stream."""
        await self._route(tokens, "credit", self.on_credit_nonces)

    async def keep(self, tokens: list[LeaseToken]) -> None:
        """Tells whichever replica holds the stream that these leases were extended."""
        await self._route(tokens, "keep", self.on_keep_nonces)

    async def _route(
        self, tokens: list[LeaseToken], kind: str, local_handler: Callable[[list[str]], None]
    ) -> None:
        remote: dict[str, list[str]] = defaultdict(list)
        local: list[str] = []
        for t in tokens:
            if t.server_id == self.server_id:
                local.append(t.nonce)
            else:
                remote[t.server_id].append(t.nonce)
        local_handler(local)
        for server_id, nonces in remote.items():
            with contextlib.suppress(Exception):
                await self.store.redis.publish(
                    server_channel(server_id), f"{kind} " + " ".join(nonces)
                )

    def on_reaped(self, keys: ShardKeys, leases: list[LeaseRef]) -> None:
        tokens = [LeaseToken(keys, lease.job_id, lease.nonce) for lease in leases if lease.nonce]
        task = asyncio.create_task(self.credit(tokens))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
