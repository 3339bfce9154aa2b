"""Client-side batching: concurrent enqueue calls gathered into EnqueueBatch calls."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from delayq.errors import DelayqError, from_status
from delayq.models import EnqueueResult
from delayq.v1 import service_pb2

__all__ = ["AsyncBatcher", "Batching", "Outcome", "ThreadBatcher", "resolve"]

#: One job's answer: its result, or the error its caller raises.
Outcome = EnqueueResult | DelayqError

#: Sends one group of requests (all idempotent, or none) and answers index-aligned.
AsyncSender = Callable[[list[service_pb2.EnqueueRequest], float], Awaitable[list[Outcome]]]
SyncSender = Callable[[list[service_pb2.EnqueueRequest], float], list[Outcome]]


@dataclass(frozen=True)
class Batching:
    """How concurrent `enqueue` calls are gathered (docs/decisions.md, issue 12).

    A call is sent at once when no batch call of the client is in flight (after
    the current event-loop turn, so calls started together travel together).
    While calls are in flight, waiting calls go when one returns (group
    commit), after `max_delay` seconds, when `max_items` jobs or `max_bytes`
    encoded bytes wait, or, while fewer than `max_in_flight` calls are out, as
    soon as `split_items` jobs wait. Jobs sent together are spread over the free
    slots in calls of at least `split_items` jobs, so a busy producer can build
    its next batch while one is out. A lone call is never delayed.
    """

    #: Longest a call waits for company while another batch call is in flight.
    max_delay: float = 0.005
    #: Most jobs per EnqueueBatch call (the contract allows 1000).
    max_items: int = 500
    #: Most encoded request bytes per call, far under gRPC's 4 MiB default limit.
    max_bytes: int = 1024 * 1024
    #: Most batch calls in flight at once (the sync client's sender threads).
    max_in_flight: int = 4
    #: Fewest jobs a call sends while another is in flight, and per call when waiting
    #: jobs are spread over free slots (0: `max_items`, one call at a time unless a
    #: full one waits). Each call costs the server a fixed ~0.5 ms of CPU: 25 lets 50
    #: busy callers keep two calls out, measured +9-21% jobs/s on a quiet 2-core
    #: machine and -21% when its cores were busy (docs/decisions.md, issue 12).
    #: The blocking client's ThreadBatcher does not use it.
    split_items: int = 25
    #: Batches go as messages on one long-lived EnqueueStream (about half the cost of a
    #: unary call on each side; unary calls again when the server lacks it). False: one
    #: EnqueueBatch (or Enqueue) call per batch, which a load balancer spreads over
    #: server replicas call by call.
    stream: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.max_delay <= 1:
            raise ValueError("Batching.max_delay must be between 0 and 1 second")
        if not 1 <= self.max_items <= 1000:
            raise ValueError("Batching.max_items must be between 1 and 1000")
        if not 1024 <= self.max_bytes <= 3 * 1024 * 1024:
            raise ValueError("Batching.max_bytes must be between 1 KiB and 3 MiB")
        if self.max_in_flight < 1:
            raise ValueError("Batching.max_in_flight must be at least 1")
        if not 0 <= self.split_items <= self.max_items:
            raise ValueError("Batching.split_items must be between 0 and max_items")


def resolve(batching: Batching | bool | None, default: bool) -> Batching | None:
    """`batching` argument of a client -> settings, or None for one RPC per call."""
    if batching is None:
        batching = default
    if batching is True:
        return Batching()
    if batching is False:
        return None
    return batching


def fresh(err: DelayqError) -> DelayqError:
    """A copy per caller: raising one exception object from many tasks tangles tracebacks."""
    return from_status(err.code, err.message)


@dataclass
class _Item:
    request: service_pb2.EnqueueRequest
    size: int
    timeout: float
    future: Any  # asyncio.Future[EnqueueResult] or concurrent.futures.Future[EnqueueResult]


def _groups(items: list[_Item]) -> list[list[_Item]]:
    """Split by idempotency: a batch is retried on UNAVAILABLE only if every job has a key."""
    keyed = [i for i in items if i.request.idempotency_key]
    if not keyed:
        return [items]
    if len(keyed) == len(items):
        return [keyed]
    return [[i for i in items if not i.request.idempotency_key], keyed]


def _settle(items: Sequence[_Item], outcomes: Sequence[Outcome]) -> None:
    for item, out in zip(items, outcomes, strict=True):
        if item.future.done():  # the caller gave up (cancelled or timed out)
            continue
        if isinstance(out, DelayqError):
            item.future.set_exception(fresh(out))
        else:
            item.future.set_result(out)


def _fail(items: Sequence[_Item], exc: BaseException) -> None:
    for item in items:
        if item.future.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            item.future.cancel()
        else:
            item.future.set_exception(fresh(exc) if isinstance(exc, DelayqError) else exc)


class AsyncBatcher:
    """Gathers AsyncClient.enqueue calls on one event loop; see `Batching`."""

    def __init__(self, send: AsyncSender, settings: Batching) -> None:
        self._send = send
        self._settings = settings
        self._pending: list[_Item] = []
        self._pending_bytes = 0
        self._handle: asyncio.Handle | None = None
        self._soon = False  # whether _handle is a call_soon (else the max_delay timer)
        self._split = settings.split_items or settings.max_items
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def submit(self, request: service_pb2.EnqueueRequest, timeout: float) -> asyncio.Future[Any]:
        """Queue one request; the future resolves to its EnqueueResult or DelayqError."""
        if self._closed:
            raise RuntimeError("AsyncClient is closed")
        loop = asyncio.get_running_loop()
        s = self._settings
        size = request.ByteSize() + 8
        if self._pending and self._pending_bytes + size > s.max_bytes:
            self._flush(force=True)
        fut: asyncio.Future[Any] = loop.create_future()
        self._pending.append(_Item(request, size, timeout, fut))
        self._pending_bytes += size
        if len(self._pending) >= s.max_items or self._pending_bytes >= s.max_bytes:
            self._flush(force=True)
        elif self._handle is None or (not self._soon and self._ready()):
            if self._handle is not None:
                self._handle.cancel()
            self._soon = self._ready()
            self._handle = (
                loop.call_soon(self._flush)
                if self._soon
                else loop.call_later(s.max_delay, self._flush, True)
            )
        return fut

    def _ready(self) -> bool:
        """Whether the waiting jobs may go now: nothing is in flight (a lone call is never
        delayed), or a slot is free and they fill a call of `split_items` (each call
        costs the server a fixed ~0.5 ms of CPU, so small ones wait for company)."""
        s = self._settings
        return self._in_flight == 0 or (
            self._in_flight < s.max_in_flight and len(self._pending) >= self._split
        )

    def _flush(self, force: bool = False) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        items = self._pending
        if not items:
            return
        s = self._settings
        if not force and not self._ready():  # things changed since this was scheduled
            self._soon = False
            self._handle = asyncio.get_running_loop().call_later(s.max_delay, self._flush, True)
            return
        free = s.max_in_flight - self._in_flight
        calls = max(1, min(free, len(items) // self._split))
        self._pending, self._pending_bytes = [], 0
        # Spread evenly, so the calls return at different times and the callers they
        # release gather again while the others are still out (a pipeline, not a burst).
        per, extra = divmod(len(items), calls)
        start = 0
        for k in range(calls):
            end = start + per + (1 if k < extra else 0)
            for group in _groups(items[start:end]):
                self._in_flight += 1
                task = asyncio.get_running_loop().create_task(self._run(group))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            start = end

    async def _run(self, items: list[_Item]) -> None:
        try:
            outcomes = await self._send([i.request for i in items], max(i.timeout for i in items))
        except BaseException as exc:  # an RPC-level error fails every job of the call
            _fail(items, exc)
            if not isinstance(exc, Exception):
                raise
        else:
            _settle(items, outcomes)
        finally:
            self._in_flight -= 1
            # Group commit: what gathered while calls were out goes once it may.
            if self._pending and self._ready():
                self._flush()

    async def close(self) -> None:
        """Send what is waiting and wait for every call in flight."""
        self._closed = True
        self._flush(force=True)
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


class ThreadBatcher:
    """Gathers Client.enqueue calls from many threads; see `Batching`.

    One collector thread forms the batches; up to `max_in_flight` sender
    threads make the blocking calls.
    """

    def __init__(self, send: SyncSender, settings: Batching) -> None:
        self._send = send
        self._settings = settings
        self._cond = threading.Condition()
        self._pending: list[_Item] = []
        self._pending_bytes = 0
        self._oldest = 0.0
        self._in_flight = 0
        self._closed = False
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=settings.max_in_flight, thread_name_prefix="delayq-batch"
        )
        self._collector = threading.Thread(target=self._collect, name="delayq-batcher", daemon=True)
        self._collector.start()

    def submit(
        self, request: service_pb2.EnqueueRequest, timeout: float
    ) -> concurrent.futures.Future[Any]:
        """Queue one request; the future resolves to its EnqueueResult or DelayqError."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        size = request.ByteSize() + 8
        with self._cond:
            if self._closed:
                raise RuntimeError("Client is closed")
            if not self._pending:
                self._oldest = time.monotonic()
            self._pending.append(_Item(request, size, timeout, fut))
            self._pending_bytes += size
            self._cond.notify_all()
        return fut

    def _full(self) -> bool:
        s = self._settings
        return len(self._pending) >= s.max_items or self._pending_bytes >= s.max_bytes

    def _take(self) -> list[_Item]:
        """Up to one call's worth of waiting items (the caller holds the lock)."""
        s = self._settings
        n, size = 0, 0
        for item in self._pending:
            if n and (n >= s.max_items or size + item.size > s.max_bytes):
                break
            n += 1
            size += item.size
        items, self._pending = self._pending[:n], self._pending[n:]
        self._pending_bytes -= size
        self._oldest = time.monotonic()
        return items

    def _collect(self) -> None:
        s = self._settings
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                # Wait for company only while another call is out (cf. AsyncBatcher).
                while not self._closed and not self._full() and self._in_flight > 0:
                    left = self._oldest + s.max_delay - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                items = self._take()
                groups = _groups(items)
                self._in_flight += len(groups)
            for group in groups:
                self._pool.submit(self._run, group)

    def _run(self, items: list[_Item]) -> None:
        try:
            outcomes = self._send([i.request for i in items], max(i.timeout for i in items))
        except BaseException as exc:  # an RPC-level error fails every job of the call
            _fail(items, exc)
        else:
            _settle(items, outcomes)
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def close(self) -> None:
        """Send what is waiting and wait for every call in flight."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self._collector.join()
        self._pool.shutdown(wait=True)
