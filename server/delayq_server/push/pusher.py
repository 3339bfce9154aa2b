"""The pusher: one consumer per push target, leasing due jobs and settling each by its HTTP outcome.

It leases through the dispatcher like a Consume stream (same claim script,
fenced lease tokens, attempts, wake-ups) with ``concurrency`` deliveries
outstanding at most, and settles with the store's ack and nack (backoff,
Retry-After, dead letter when attempts run out).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import aiohttp

from delayq_server.dispatcher import Dispatcher
from delayq_server.ids import LeaseToken
from delayq_server.push import sender, ssrf
from delayq_server.push.acks import AckBatcher
from delayq_server.push.config import PushConfig, Target
from delayq_server.store import (
    AckOutcome,
    Claimed,
    LeaseRef,
    ShardKeys,
    StaleLease,
    Store,
    UnknownJob,
)

log = logging.getLogger(__name__)

# The lease outlives the request: its timeout plus time to ack or nack. A pusher
# that dies mid-request leaves the lease to the reaper (redelivery, attempt counted).
LEASE_MARGIN_MS = 10_000
# A delivery that waited this long for a slot (per-host limit) renews its lease first.
EXTEND_AFTER_S = 1.0
STOP_WAIT_S = 5.0  # requests under way at stop get this long to finish and settle


class _TargetLoop:
    """Deliveries of one queue to its target."""

    def __init__(self, pusher: Pusher, target: Target) -> None:
        self.p = pusher
        self.target = target
        self.session: aiohttp.ClientSession | None = None
        self.in_flight: set[asyncio.Task[None]] = set()
        # Belt and braces over the stream's credit, which already bounds deliveries.
        self.slots = asyncio.Semaphore(target.concurrency)

    def _session(self) -> aiohttp.ClientSession:
        # One pool per target: its socket factory enforces the target's allowlist
        # on every connect (push/ssrf.py). No proxy from the environment.
        connector = aiohttp.TCPConnector(
            limit=self.target.concurrency,
            socket_factory=ssrf.socket_factory(self.target),
            ttl_dns_cache=10,
        )
        return aiohttp.ClientSession(
            connector=connector,
            trust_env=False,
            auto_decompress=False,  # the body cap counts bytes on the wire
            skip_auto_headers=("Accept-Encoding",),
        )

    async def run(self) -> None:
        t = self.target
        store = self.p.store
        shards = await store.shard_count(t.namespace, t.queue, create=True)
        self.p.ensure_timers(t.namespace, t.queue, shards)
        keys = [ShardKeys(t.namespace, t.queue, s) for s in range(shards)]
        self.session = self._session()
        stream = self.p.dispatcher.open(
            [keys],
            max_outstanding=t.concurrency,
            lease_ms=t.timeout_ms + LEASE_MARGIN_MS,
            max_batch=t.concurrency,
        )
        try:
            async for batch in stream.deliveries():
                for shard_keys, claimed in batch:
                    task = asyncio.create_task(self._deliver(shard_keys, claimed))
                    self.in_flight.add(task)
                    task.add_done_callback(self.in_flight.discard)
        finally:
            # Requests under way may finish and settle; the rest are cut and their
            # leases released by the stream (attempt counted: the receiver may
            # have seen them).
            if self.in_flight:
                _, late = await asyncio.wait(set(self.in_flight), timeout=STOP_WAIT_S)
                for task in late:
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
            self.p.dispatcher.close(stream)
            await self.session.close()

    async def _deliver(self, keys: ShardKeys, c: Claimed) -> None:
        t = self.target
        assert self.session is not None  # made by run() before any delivery
        token = LeaseToken(keys, c.job_id, c.nonce)
        clock = asyncio.get_running_loop().time
        queued = clock()
        async with self.slots, self.p.host_slots(t.host_port):
            if clock() - queued > EXTEND_AFTER_S and not await self._renew(keys, c):
                await self.p.dispatcher.credit([token])
                return
            try:
                outcome = await sender.send(self.session, t, keys, c, self.p.cfg.retry_after_max_ms)
            except Exception as exc:  # a bug or an odd answer: a failed try, never a lost slot
                log.exception("push %s/%s %s", t.namespace, t.queue, c.job_id)
                outcome = sender.Outcome(False, f"push: {type(exc).__name__}: {exc}"[:300])
        try:
            await self._settle(keys, c, outcome)
        except Exception as exc:  # Redis trouble: the lease runs out and the reaper retries
            log.warning("push %s/%s %s: settling failed: %s", t.namespace, t.queue, c.job_id, exc)
        finally:
            await self.p.dispatcher.credit([token])  # the stream's slot frees either way

    async def _renew(self, keys: ShardKeys, c: Claimed) -> bool:
        """A delivery that waited for a host slot gets a whole lease for its request
        again; False when the lease was lost meanwhile (the job is someone else's)."""
        try:
            await self.p.store.extend(
                keys, LeaseRef(c.job_id, c.nonce), self.target.timeout_ms + LEASE_MARGIN_MS
            )
        except (StaleLease, UnknownJob):
            return False
        except Exception as exc:  # Redis trouble: send on the lease we have
            log.warning("push %s: renewing the lease failed: %s", c.job_id, exc)
        return True

    async def _settle(self, keys: ShardKeys, c: Claimed, outcome: sender.Outcome) -> None:
        ref = LeaseRef(c.job_id, c.nonce)
        store = self.p.store
        if outcome.ok:
            code = await self.p.acks.ack(keys, ref)
            if code != AckOutcome.ACKED:
                log.info("push %s: ack after the lease was lost (job redelivered)", c.job_id)
            return
        log.debug("push %s attempt %d failed: %s", c.job_id, c.record.attempts, outcome.reason)
        try:
            await store.nack(
                keys, ref, delay_ms=outcome.retry_after_ms, dead_letter=False, reason=outcome.reason
            )
        except (StaleLease, UnknownJob):
            log.info(
                "push %s: nack after the lease was lost (job redelivered or deleted)", c.job_id
            )


class Pusher:
    """Every configured push target of this process."""

    def __init__(
        self,
        cfg: PushConfig,
        store: Store,
        dispatcher: Dispatcher,
        ensure_timers: Callable[[str, str, int], None],
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.dispatcher = dispatcher
        self.ensure_timers = ensure_timers
        self._hosts: dict[str, asyncio.Semaphore] = {}
        self.acks = AckBatcher(store)
        self._loops = [_TargetLoop(self, t) for t in cfg.targets]
        self._tasks: list[asyncio.Task[None]] = []

    def host_slots(self, host_port: str) -> asyncio.Semaphore:
        """Requests to one host:port over all targets are bounded too."""
        sem = self._hosts.get(host_port)
        if sem is None:
            sem = self._hosts[host_port] = asyncio.Semaphore(self.cfg.per_host_concurrency)
        return sem

    def start(self) -> None:
        for loop in self._loops:
            t = loop.target
            log.info(
                "pushing %s/%s to %s (concurrency %d)", t.namespace, t.queue, t.url, t.concurrency
            )
            task = asyncio.create_task(self._run(loop), name=f"push {t.namespace}/{t.queue}")
            self._tasks.append(task)

    async def _run(self, loop: _TargetLoop) -> None:
        """Restarts a target's loop after a failure (Redis down), with a pause."""
        while True:
            try:
                await loop.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                t = loop.target
                log.warning("push %s/%s: %s; retrying in 1s", t.namespace, t.queue, exc)
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
