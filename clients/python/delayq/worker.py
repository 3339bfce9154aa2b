"""Worker runtime: handlers per queue over one Consume stream, with renewal, batched acks,
reconnects and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import heapq
import inspect
import logging
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import grpc

from delayq import _convert
from delayq._backoff import Backoff
from delayq._channel import resolve_target
from delayq._common import AckOutcome, ReleaseOutcome
from delayq._convert import DurationLike
from delayq.aio import AsyncClient
from delayq.errors import DelayqError, from_rpc_error
from delayq.models import Delivery
from delayq.outcomes import DeadLetter, Retry
from delayq.serializers import Serializer

__all__ = ["Handler", "Worker", "WorkerStats"]

log = logging.getLogger("delayq.worker")

#: A handler takes the delivery; it may be a plain function (run in a thread) or a coroutine.
Handler = Callable[[Delivery], Any]
H = TypeVar("H", bound=Handler)

# Statuses on which reconnecting cannot help: the request itself is refused.
_FATAL = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
# A lease that the server no longer recognises: the job moved on without us.
_LEASE_LOST = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND})


@dataclass
class WorkerStats:
    """Counters of one worker run."""

    received: int = 0
    succeeded: int = 0
    retried: int = 0
    dead_lettered: int = 0
    failed: int = 0
    acked: int = 0
    ack_stale: int = 0
    leases_extended: int = 0
    leases_lost: int = 0
    reconnects: int = 0
    released: int = 0  # given back unstarted (Release): attempts not counted
    released_on_shutdown: int = 0  # ... of which at shutdown
    abandoned_on_shutdown: int = 0  # started, still running when the grace ran out


@dataclass
class _Inflight:
    delivery: Delivery
    received: float
    started: bool = False
    lost: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)


class Worker:
    """Runs handlers for jobs of several queues over one Consume stream.

    ``@worker.handler("emails")`` registers a handler; queues are consumed in
    registration order (earlier queues are preferred). A handler receives a
    `delayq.Delivery`; returning acks the job, raising `delayq.Retry` retries
    it after the given delay, raising `delayq.DeadLetter` dead-letters it, and
    any other exception nacks it so the job's retry policy applies (and it is
    dead-lettered once attempts run out). Coroutine handlers run on the event
    loop; plain functions run in a thread pool of `concurrency` threads.

    At most `concurrency` jobs run at once; `prefetch` more may wait leased
    (the stream's `max_outstanding` is their sum). Leases are `lease` long and
    extended while a handler runs past half of it. Acks are batched: they gather
    for up to `ack_linger` (10 ms; 0 sends at once) and tokens finished while
    an Ack call is in flight go out together in the next one; a worker whose
    stream credit is used up sends at once.

    Deliveries the worker received but did not start are given back with
    Release, so their attempts are not counted (shutdown, a broken stream).
    The stream asks the server for a `release_grace` (5 s by default, at most
    `lease`): when the stream breaks (a transport blip), the server keeps its
    leases that long, so the worker reconnects, gives back what it had not
    started, extends what is running, and running handlers still ack over unary
    calls instead of their jobs running twice. The cost: after a real crash of
    the worker its jobs are redelivered after the grace instead of at once
    (docs/decisions.md). `release_grace=0` restores at-once release.

    `run()` blocks and handles SIGTERM/SIGINT: stop taking work (closing the
    stream; the grace keeps the leases), give back what was not started, let
    in-flight handlers finish for up to `grace`, flush acks, and retry at once
    (nack) whatever is still running. A second signal skips the grace.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        namespace: str = "default",
        concurrency: int = 16,
        prefetch: int = 0,
        lease: DurationLike = timedelta(seconds=30),
        grace: DurationLike = timedelta(seconds=30),
        release_grace: DurationLike = timedelta(seconds=5),
        max_batch: int = 0,
        ack_batch: int = 1000,
        ack_concurrency: int = 2,
        ack_linger: DurationLike = timedelta(milliseconds=10),
        serializer: Serializer | None = None,
        reconnect_backoff: Backoff | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
        timeout: float = 10.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        lease_td = _convert.to_timedelta(lease)
        if lease_td < timedelta(seconds=1):
            raise ValueError("lease must be at least 1 s (the server's minimum)")
        if prefetch < 0:
            raise ValueError("prefetch must not be negative")
        release_grace_td = _convert.to_timedelta(release_grace)
        if release_grace_td < timedelta(0):
            raise ValueError("release_grace must not be negative")
        self.target = resolve_target(target)
        self.namespace = namespace
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease = lease_td
        self.grace = _convert.to_timedelta(grace)
        # The server accepts at most the lease: a longer grace would outlive it.
        self.release_grace = min(release_grace_td, lease_td)
        self.max_batch = max_batch
        self.ack_batch = max(1, min(ack_batch, 1000))
        self.ack_concurrency = max(1, ack_concurrency)
        ack_linger_td = _convert.to_timedelta(ack_linger)
        if ack_linger_td < timedelta(0):
            raise ValueError("ack_linger must not be negative")
        self.ack_linger = ack_linger_td
        self.stats = WorkerStats()
        self._serializer = serializer
        self._reconnect_backoff = reconnect_backoff or Backoff(initial=0.1, maximum=5.0)
        self._credentials = credentials
        self._token = token
        self._options = options
        self._timeout = timeout
        self._handlers: dict[str, Handler] = {}
        self._stop_requested = False
        self._hurry = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._running = False

    # -- registration -----------------------------------------------------------------

    def handler(self, queue: str) -> Callable[[H], H]:
        """Decorator registering `fn` as the handler of `queue`."""

        def register(fn: H) -> H:
            self.add_handler(queue, fn)
            return fn

        return register

    def add_handler(self, queue: str, fn: Handler) -> None:
        """Register `fn` as the handler of `queue` (one handler per queue)."""
        if queue in self._handlers:
            raise ValueError(f"queue {queue!r} already has a handler")
        if self._running:
            raise RuntimeError("register handlers before the worker starts")
        self._handlers[queue] = fn

    @property
    def queues(self) -> list[str]:
        """The consumed queues, in priority order."""
        return list(self._handlers)

    # -- lifecycle --------------------------------------------------------------------

    def run(self, *, install_signal_handlers: bool = True) -> None:
        """Run until stopped (SIGTERM/SIGINT or `stop()`); returns after a graceful shutdown."""
        asyncio.run(self.serve(install_signal_handlers=install_signal_handlers))

    def stop(self) -> None:
        """Ask for a graceful shutdown; safe to call from any thread or a signal handler.

        A second call skips the remaining grace period.
        """
        if self._stop_requested:
            self._hurry = True
        self._stop_requested = True
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stopping.set)

    async def serve(self, *, install_signal_handlers: bool = False) -> None:
        """Run on the current loop until `stop()`; raises DelayqError on a fatal refusal."""
        if not self._handlers:
            raise RuntimeError("no handlers registered")
        if self._running:
            raise RuntimeError("worker already running")
        self._running = True
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested:
            self._stopping.set()
        signals = (signal.SIGTERM, signal.SIGINT) if install_signal_handlers else ()
        for sig in signals:
            self._loop.add_signal_handler(sig, self._on_signal, sig)
        self._client = AsyncClient(
            self.target,
            namespace=self.namespace,
            timeout=self._timeout,
            serializer=self._serializer,
            credentials=self._credentials,
            token=self._token,
            options=self._options,
        )
        self._executor = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix="delayq-handler"
        )
        self._sem = asyncio.Semaphore(self.concurrency)
        self._inflight: dict[str, _Inflight] = {}
        self._ack_pending: list[str] = []
        self._ack_calls = 0
        self._ack_sending = 0  # tokens in Ack calls under way
        self._acks_due = False  # the pending tokens lingered long enough: send them
        self._ack_timer: asyncio.TimerHandle | None = None
        self._acks_drained = asyncio.Event()
        self._acks_drained.set()
        self._renew_heap: list[tuple[float, str]] = []
        self._renew_wakeup = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._call: Any = None
        renewer = asyncio.create_task(self._renew_loop(), name="delayq-renew")
        consumer = asyncio.create_task(self._consume_loop(), name="delayq-consume")
        stop_wait = asyncio.create_task(self._stopping.wait())
        fatal: BaseException | None = None
        try:
            await asyncio.wait({consumer, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if consumer.done() and consumer.exception() is not None:
                fatal = consumer.exception()
            await self._shutdown(consumer)
        finally:
            stop_wait.cancel()
            renewer.cancel()
            for task in (stop_wait, renewer, consumer):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            self._executor.shutdown(wait=False, cancel_futures=True)
            await self._client.close()
            for sig in signals:
                self._loop.remove_signal_handler(sig)
            self._running = False
        if fatal is not None:
            raise fatal

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("received %s, shutting down", sig.name)
        self.stop()

    async def _shutdown(self, consumer: asyncio.Task[None]) -> None:
        assert self._stopping is not None
        self._stopping.set()
        deadline = time.monotonic() + (0.0 if self._hurry else self.grace.total_seconds())
        grace_on = self.release_grace > timedelta(0)
        if grace_on:
            # 1. No new deliveries: close the stream now. The server keeps its
            # leases for the release grace; what runs is extended (kept), what
            # was never started is given back uncounted.
            self._close_stream(consumer)
            await self._settle_unstarted_and_keep_running(shutdown=True)
        # 2. Finish what has started, within the grace period.
        while True:
            started = [f.task for f in self._inflight.values() if f.started and f.task]
            if not started or self._hurry:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.wait(started, timeout=min(remaining, 0.5))
        # 3. Flush acks (without a release grace: while the stream is still open,
        # since closing it releases every lease at once).
        remaining = max(deadline - time.monotonic(), 2.0)
        self._flush_acks()  # no linger on the way out
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._acks_drained.wait(), remaining)
        unfinished = [f for f in self._inflight.values() if f.task is None or not f.task.done()]
        running = [f for f in unfinished if f.started and not f.lost]
        if not grace_on:
            # 4a. Close the stream: the server releases every job not finished, counted.
            if unfinished:
                log.warning(
                    "closing with %d jobs unfinished; the server releases them", len(unfinished)
                )
            self._close_stream(consumer)
        elif running:
            # 4b. Handlers that outran the grace: retried at once, attempt counted.
            self.stats.abandoned_on_shutdown += len(running)
            log.warning(
                "%d handlers still running after the grace; retrying their jobs", len(running)
            )
            # Bounded: _nack retries UNAVAILABLE, and a gone server must not hang us.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.gather(
                        *(
                            self._nack(f, delay=timedelta(0), reason="worker shut down mid-job")
                            for f in running
                        ),
                        return_exceptions=True,
                    ),
                    timeout=5.0,
                )
        for f in unfinished:
            if f.task is not None:
                f.task.cancel()
        tasks = [f.task for f in unfinished if f.task is not None] + list(self._background)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)

    def _close_stream(self, consumer: asyncio.Task[None]) -> None:
        if self._call is not None:
            self._call.cancel()
        consumer.cancel()

    async def _settle_unstarted_and_keep_running(self, *, shutdown: bool) -> None:
        """After the stream closed (with a release grace): give back every delivery
        not started, uncounted, and extend every running one at once, so the
        server's grace does not release it under its handler."""
        unstarted = [f for f in self._inflight.values() if not f.started and not f.lost]
        for f in unstarted:
            f.lost = True  # never starts now: its task returns when it gets a slot
        for f in self._inflight.values():
            if f.started and not f.lost:
                task = asyncio.create_task(self._extend(f))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        tokens = [f.delivery.lease_token for f in unstarted]
        released = 0
        for i in range(0, len(tokens), 1000):
            try:
                results = await self._client.release(
                    tokens[i : i + 1000],
                    retry_deadline=self.release_grace.total_seconds(),
                )
            except DelayqError as err:
                log.warning("Release of %d deliveries failed: %s", len(tokens[i : i + 1000]), err)
                continue
            released += sum(1 for r in results if r == ReleaseOutcome.RELEASED)
        self.stats.released += released
        if shutdown:
            self.stats.released_on_shutdown += released

    # -- consuming --------------------------------------------------------------------

    async def _consume_loop(self) -> None:
        assert self._stopping is not None
        failures = 0
        while not self._stopping.is_set():
            call = self._client.consume_call(
                self.queues,
                max_outstanding=self.concurrency + self.prefetch,
                lease=self.lease,
                max_batch=self.max_batch,
                release_grace=self.release_grace if self.release_grace else None,
            )
            self._call = call
            try:
                async for msg in call:
                    failures = 0
                    for d in msg.deliveries:
                        self._dispatch(_convert.delivery_from_proto(d, self._client.serializer))
                log.warning("Consume stream ended by the server; reconnecting")
            except grpc.RpcError as exc:
                err = from_rpc_error(exc)
                if self._stopping.is_set():
                    return
                if err.code in _FATAL:
                    log.error("Consume refused: %s", err)
                    raise err from None
                log.warning("Consume stream broke (%s); reconnecting", err)
            finally:
                self._call = None
            if self.release_grace > timedelta(0):
                # The server keeps this stream's leases for the grace: settle them.
                settle = asyncio.create_task(
                    self._settle_unstarted_and_keep_running(shutdown=False)
                )
                self._background.add(settle)
                settle.add_done_callback(self._background.discard)
            else:
                self._forget_unstarted()
            self.stats.reconnects += 1
            wait = self._reconnect_backoff.delay(failures)
            failures += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)

    def _forget_unstarted(self) -> None:
        # Without a release grace the server released the leases of a closed stream
        # at once; work not yet started would only be acked as stale, so drop it.
        for f in self._inflight.values():
            if not f.started and f.task is not None:
                f.lost = True

    def _dispatch(self, delivery: Delivery) -> None:
        self.stats.received += 1
        assert self._stopping is not None
        entry = _Inflight(delivery=delivery, received=time.monotonic())
        self._inflight[delivery.lease_token] = entry
        if self._stopping.is_set():
            return  # held: given back at shutdown (or released when the stream closes)
        entry.task = asyncio.create_task(self._process(entry))
        self._schedule_renewal(delivery.lease_token, entry.received)

    async def _process(self, entry: _Inflight) -> None:
        d = entry.delivery
        token = d.lease_token
        assert self._stopping is not None
        try:
            async with self._sem:
                if entry.lost or self._stopping.is_set():
                    return
                entry.started = True
                fn = self._handlers.get(d.queue)
                try:
                    if fn is None:
                        raise DeadLetter(f"no handler for queue {d.queue!r} in this worker")
                    await self._invoke(fn, d)
                except Retry as r:
                    await self._nack(entry, delay=r.delay, reason=r.reason)
                    self.stats.retried += 1
                except DeadLetter as dl:
                    await self._nack(entry, dead_letter=True, reason=dl.reason)
                    self.stats.dead_lettered += 1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.exception("handler for %s job %s failed", d.queue, d.id)
                    await self._nack(entry, reason=f"{type(exc).__name__}: {exc}"[:4096])
                    self.stats.failed += 1
                else:
                    self.stats.succeeded += 1
                    if not entry.lost:
                        self._queue_ack(token)
        finally:
            if entry.started or entry.lost:
                self._inflight.pop(token, None)
            # else: never started (stopping): stays listed so shutdown gives it back

    async def _invoke(self, fn: Handler, d: Delivery) -> None:
        if inspect.iscoroutinefunction(fn):
            await fn(d)
            return
        loop = asyncio.get_running_loop()
        ctx = contextvars.copy_context()
        result = await loop.run_in_executor(self._executor, functools.partial(ctx.run, fn, d))
        if inspect.isawaitable(result):
            await result

    async def _nack(
        self,
        entry: _Inflight,
        *,
        delay: timedelta | None = None,
        dead_letter: bool = False,
        reason: str = "",
    ) -> None:
        # Nack is retried here (not in the client) because a repeat of a nack that
        # did land is answered as a stale or unknown token, which is harmless.
        failures = 0
        while True:
            try:
                await self._client.nack(
                    entry.delivery.lease_token, delay=delay, dead_letter=dead_letter, reason=reason
                )
                return
            except DelayqError as err:
                if err.code in _LEASE_LOST:
                    self._lease_lost(entry, err)
                    return
                if err.code != grpc.StatusCode.UNAVAILABLE:
                    log.error("Nack of job %s failed: %s", entry.delivery.id, err)
                    return
            await asyncio.sleep(self._reconnect_backoff.delay(failures))
            failures += 1

    def _lease_lost(self, entry: _Inflight, err: DelayqError) -> None:
        if not entry.lost:
            entry.lost = True
            self.stats.leases_lost += 1
            log.warning("lease on job %s lost: %s", entry.delivery.id, err)

    # -- acks -------------------------------------------------------------------------

    def _queue_ack(self, token: str) -> None:
        """Acks gather for up to `ack_linger` and go in one call: at 1,000 jobs/s a
        call per job costs the server a unary call each (about 1 ms of its CPU,
        docs/decisions.md). No linger when this worker has no stream credit left
        (its next delivery waits for these acks), when a call would be full, or
        while stopping."""
        assert self._stopping is not None
        self._ack_pending.append(token)
        self._acks_drained.clear()
        # The token's job is still listed in _inflight here (dropped right after).
        held = len(self._inflight) - 1 + len(self._ack_pending) + self._ack_sending
        if (
            self.ack_linger <= timedelta(0)
            or len(self._ack_pending) >= self.ack_batch
            or held >= self.concurrency + self.prefetch
            or self._stopping.is_set()
        ):
            self._flush_acks()
        elif self._ack_timer is None and not self._acks_due:
            loop = asyncio.get_running_loop()
            self._ack_timer = loop.call_later(self.ack_linger.total_seconds(), self._flush_acks)

    def _flush_acks(self) -> None:
        """The pending tokens are due: they go out as Ack call slots free up."""
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
        self._acks_due = True
        self._kick_acks()

    def _kick_acks(self) -> None:
        while self._ack_pending and self._acks_due and self._ack_calls < self.ack_concurrency:
            batch = self._ack_pending[: self.ack_batch]
            del self._ack_pending[: self.ack_batch]
            self._ack_calls += 1
            self._ack_sending += len(batch)
            task = asyncio.create_task(self._send_acks(batch))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        if not self._ack_pending:
            self._acks_due = False  # the next token starts a new linger
            if self._ack_calls == 0:
                self._acks_drained.set()

    async def _send_acks(self, batch: list[str]) -> None:
        try:
            results = await self._client.ack(batch, retry_deadline=float("inf"))
        except DelayqError as err:
            log.error(
                "Ack of %d tokens failed: %s; their jobs will be redelivered", len(batch), err
            )
            return
        finally:
            self._ack_calls -= 1
            self._ack_sending -= len(batch)
            self._kick_acks()
        for token, result in zip(batch, results, strict=False):
            if result == AckOutcome.ACKED:
                self.stats.acked += 1
            else:
                self.stats.ack_stale += 1
                log.warning(
                    "ack of a delivery was refused as %s; the job was redelivered or is gone",
                    "stale" if result == AckOutcome.STALE else "unknown",
                )
                log.debug("refused token %s", token)

    # -- lease renewal ----------------------------------------------------------------

    def _schedule_renewal(self, token: str, since: float) -> None:
        # Renew at half the lease: leaves the other half for the call and retries.
        due = since + self.lease.total_seconds() / 2
        first = not self._renew_heap or due < self._renew_heap[0][0]
        heapq.heappush(self._renew_heap, (due, token))
        if first:
            self._renew_wakeup.set()

    async def _renew_loop(self) -> None:
        while True:
            self._renew_wakeup.clear()
            if not self._renew_heap:
                await self._renew_wakeup.wait()
                continue
            due, token = self._renew_heap[0]
            wait = due - time.monotonic()
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._renew_wakeup.wait(), wait)
                continue
            heapq.heappop(self._renew_heap)
            entry = self._inflight.get(token)
            if entry is None or entry.lost:
                continue
            task = asyncio.create_task(self._extend(entry))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _extend(self, entry: _Inflight) -> None:
        token = entry.delivery.lease_token
        try:
            await self._client.extend_lease(
                token, self.lease, retry_deadline=self.lease.total_seconds() / 2
            )
        except DelayqError as err:
            if err.code in _LEASE_LOST:
                self._lease_lost(entry, err)
                return
            log.warning("ExtendLease of job %s failed: %s; trying again", entry.delivery.id, err)
            self._schedule_renewal(token, time.monotonic() - self.lease.total_seconds() / 2 + 1)
            return
        self.stats.leases_extended += 1
        if token in self._inflight:
            self._schedule_renewal(token, time.monotonic())
