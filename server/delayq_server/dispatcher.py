"""This replica's Consume streams: opening, closing, credit and wake-ups.

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
from collections.abc import Callable

from delayq_server import events
from delayq_server.ids import LeaseToken
from delayq_server.store import Claimed, LeaseRef, ShardKeys, Store
from delayq_server.stream import IDLE_FALLBACK_S, ConsumeStream
from delayq_server.wakeups import ReadyBoard

log = logging.getLogger(__name__)


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
        self.board = ReadyBoard()
        # Leases a closed stream gave back, per shard (telemetry.py counts them).
        self.on_released: Callable[[ShardKeys, int], None] = lambda keys, n: None
        hub.listen(events.READY, self._on_ready)

    def stream_count(self) -> int:
        """Open Consume streams (those in their release grace included)."""
        return len(self._streams)

    def leases_in_flight(self) -> int:
        """Deliveries of this replica's streams not yet answered."""
        return sum(len(s.outstanding) for s in list(self._streams.values()))

    def _on_ready(self, tag: str, detail: str) -> None:
        self.board.fire(tag, int(detail) if detail.isdigit() else 1)

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
        # A new stream looks at each of its shards once before it waits for events.
        self.board.hint_all(stream.tags)
        return stream

    def close(self, stream: ConsumeStream) -> None:
        """Unregisters and releases the stream's leases in a task that outlives cancellation.

        With a release grace the stream stays registered (so acks, nacks, releases
        and extensions through any replica still take its leases off the list) and
        what is left is released when the grace ends.
        """
        stream.closing = True
        self.board.stop_idle(stream)
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

    def recheck(self, tag: str) -> None:
        """The shard's channel was (re)subscribed: a "ready" may have been lost."""
        self.board.fire(tag)

    def wake_all(self) -> None:
        """After a possible loss of events: every stream re-checks all its shards."""
        for stream in self._streams.values():
            self.board.hint_all(stream.tags)
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

    async def given_back(self, tokens: list[LeaseToken]) -> None:
        """Released deliveries: their streams get the credit after a cooldown
        (ConsumeStream.given_back), wherever the stream lives."""
        await self._route(tokens, "given_back")

    def on_given_back_nonces(self, nonces: list[str]) -> None:
        for nonce in nonces:
            stream = self._stream_of(nonce)
            if stream is not None:
                stream.given_back(nonce)

    async def credit(self, tokens: list[LeaseToken]) -> None:
        """Returns credit for finished leases to whichever replica holds the stream."""
        await self._route(tokens, "credit")

    async def keep(self, tokens: list[LeaseToken]) -> None:
        """Tells whichever replica holds the stream that these leases were extended."""
        await self._route(tokens, "keep")

    async def _route(
        self,
        tokens: list[LeaseToken],
        kind: str,
        item: Callable[[LeaseToken], str] = lambda t: t.nonce,
    ) -> None:
        """Hands each token's item to the replica holding its stream: this one
        directly, others over their pub/sub channel (on_message there)."""
        await self._send_remote(kind, self._hand_local(tokens, kind, item))

    def _hand_local(
        self,
        tokens: list[LeaseToken],
        kind: str,
        item: Callable[[LeaseToken], str] = lambda t: t.nonce,
    ) -> dict[str, list[str]]:
        """Hands this replica's items over now; returns the others', per replica."""
        remote: dict[str, list[str]] = defaultdict(list)
        local: list[str] = []
        for t in tokens:
            (local if t.server_id == self.server_id else remote[t.server_id]).append(item(t))
        self.on_message(kind, local)
        return remote

    async def _send_remote(self, kind: str, remote: dict[str, list[str]]) -> None:
        for server_id, items in remote.items():
            with contextlib.suppress(Exception):
                await self.store.notify_server(server_id, f"{kind} " + " ".join(items))

    def on_message(self, kind: str, items: list[str]) -> None:
        """A message for this replica's streams, local or from another replica."""
        handler = {
            "credit": self.on_credit_nonces,
            "keep": self.on_keep_nonces,
            "expired": self.on_expired_nonces,
            "answered": self.on_answered,
            "given_back": self.on_given_back_nonces,
        }.get(kind)
        if handler is not None and items:
            handler(items)

    async def answered(self, tokens: list[LeaseToken]) -> None:
        """The client answered (late) for deliveries Redis no longer holds under their
        tokens: their stream slots free (see on_reaped). The job id and the shard
        travel along, so a token forged from a real nonce with another job or under
        another namespace (answered UNKNOWN there) frees nothing."""
        await self._route(tokens, "answered", lambda t: f"{t.nonce}|{t.job_id}|{t.keys.tag}")

    def on_answered(self, items: list[str]) -> None:
        for item in items:
            parts = item.split("|")
            if len(parts) not in (2, 3):
                continue
            # Two parts: a replica from before the shard travelled along.
            tag = parts[2] if len(parts) == 3 else None
            stream = self._stream_of(parts[0])
            if stream is not None:
                stream.answered(parts[0], parts[1], tag)

    def on_expired_nonces(self, nonces: list[str]) -> None:
        """Leases of our streams that ran out (another replica's reaper may tell us)."""
        for nonce in nonces:
            stream = self._stream_of(nonce)
            if stream is not None:
                stream.lease_expired(nonce)

    def on_reaped(self, keys: ShardKeys, leases: list[LeaseRef]) -> None:
        """A lease that ran out gives its stream NO credit back: the client is slow,
        stuck or frozen, and handing it more work (the same job, even) would use up
        attempts no handler gets to try. The slot frees when the client answers
        for that delivery (an Ack, Nack or ExtendLease, even a stale one: answered)."""
        tokens = [LeaseToken(keys, lease.job_id, lease.nonce) for lease in leases if lease.nonce]
        # This replica's streams hear it now, before any other task runs (a stall
        # check among them, stream.py); other replicas over pub/sub.
        remote = self._hand_local(tokens, "expired")
        if not remote:
            return
        task = asyncio.create_task(self._send_remote("expired", remote))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
