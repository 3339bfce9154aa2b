"""The pusher: one consumer per push target, leasing due jobs and settling each by its HTTP outcome.

It leases through the dispatcher like a Consume stream (same claim script,
fenced lease tokens, attempts, wake-ups) with ``concurrency`` deliveries
outstanding at most, and settles with the store's ack and nack (backoff,
Retry-After, dead letter when attempts run out).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

import aiohttp

from delayq_server.dispatcher import Dispatcher
from delayq_server.ids import LeaseToken
from delayq_server.push import config as push_config
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
# Queue events reach only replicas that know the queue, so a target set on a queue
# this process never saw is found by polling the store's push version this often.
POLL_S = 1.0


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
    """Every push target of this process: the config file's, fixed, and those of queue
    settings (AdminService), followed as they change (docs/decisions.md "Push targets
    in queue settings": the file wins for the queues it names)."""

    def __init__(
        self,
        cfg: PushConfig | None,
        store: Store,
        dispatcher: Dispatcher,
        ensure_timers: Callable[[str, str, int], None],
    ) -> None:
        self.cfg = cfg if cfg is not None else PushConfig(())
        self.store = store
        self.dispatcher = dispatcher
        self.ensure_timers = ensure_timers
        self._hosts: dict[str, asyncio.Semaphore] = {}
        self.acks = AckBatcher(store)
        self._file = {(t.namespace, t.queue): t for t in self.cfg.targets}
        self._running: dict[tuple[str, str], tuple[_TargetLoop, asyncio.Task[None]]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._rescan = True  # the first pass reads every queue with a target
        self._wake = asyncio.Event()
        self._sync_task: asyncio.Task[None] | None = None
        self._version = -1  # the store's push version at the last full read

    def host_slots(self, host_port: str) -> asyncio.Semaphore:
        """Requests to one host:port over all targets are bounded too."""
        sem = self._hosts.get(host_port)
        if sem is None:
            sem = self._hosts[host_port] = asyncio.Semaphore(self.cfg.per_host_concurrency)
        return sem

    def start(self) -> None:
        for t in self.cfg.targets:
            self._start_loop(t)
        self._wake.set()
        self._sync_task = asyncio.create_task(self._sync_loop(), name="push settings")

    def queue_changed(self, namespace: str, queue: str) -> None:
        """A queue's settings changed (or it was deleted) through some replica."""
        self._dirty.add((namespace, queue))
        self._wake.set()

    def resync(self) -> None:
        """Change events may have been lost (a pub/sub gap): read every target again."""
        self._rescan = True
        self._wake.set()

    def resubscribed(self, tag: str | None) -> None:
        """The listener's re-subscription hook (resync.py): None is every channel;
        shard 0's channel carries the queue's events."""
        if tag is None:
            self.resync()
            return
        namespace, _, rest = tag.partition("/")
        queue, _, shard = rest.rpartition("/")
        if shard == "0":
            self.queue_changed(namespace, queue)

    def targets(self) -> list[Target]:
        """The targets pushed to now."""
        return [loop.target for loop, _ in self._running.values()]

    def _start_loop(self, t: Target) -> None:
        log.info("pushing %s/%s to %s (concurrency %d)", t.namespace, t.queue, t.url, t.concurrency)
        loop = _TargetLoop(self, t)
        task = asyncio.create_task(self._run(loop), name=f"push {t.namespace}/{t.queue}")
        self._running[(t.namespace, t.queue)] = (loop, task)

    async def _stop_loop(self, key: tuple[str, str]) -> None:
        _, task = self._running.pop(key)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def _sync_loop(self) -> None:
        """Applies setting changes one queue at a time, in the order they came."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()
            keys, self._dirty = self._dirty, set()
            rescan, self._rescan = self._rescan, False
            try:
                version = await self.store.queues.push_version()
                if version != self._version:
                    rescan = True
                if rescan:
                    keys |= set(await self.store.queues.push_queues()) | set(self._running)
                for key in sorted(keys):
                    await self._sync(key)
                    keys.discard(key)
                if rescan:
                    self._version = version
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis trouble: try what is left again
                log.warning("push: reading queue settings failed: %s; retrying in 1s", exc)
                self._dirty |= keys
                self._rescan |= rescan
                await asyncio.sleep(1.0)
                self._wake.set()

    async def _sync(self, key: tuple[str, str]) -> None:
        namespace, queue = key
        stored = await self.store.queues.push_target(namespace, queue)
        if key in self._file:
            if stored is not None:
                log.warning(
                    "push %s/%s: the push config file names this queue: its target wins "
                    "over the queue settings' one",
                    namespace,
                    queue,
                )
            return
        target: Target | None = None
        if stored is not None:
            try:  # checked by UpdateQueue already; a bad one is not pushed to
                target = push_config.queue_target(namespace, queue, json.loads(stored))
            except (ValueError, push_config.PushConfigError) as exc:
                log.error("push %s/%s: stored target refused: %s", namespace, queue, exc)
        current = self._running.get(key)
        if current is not None and current[0].target == target:
            return
        if current is not None:
            log.info("push %s/%s: target changed or cleared; stopping", namespace, queue)
            await self._stop_loop(key)
        if target is not None:
            self._start_loop(target)

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
        tasks = [task for _, task in self._running.values()]
        if self._sync_task is not None:
            tasks.append(self._sync_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._running.clear()
        self._sync_task = None
