"""asyncio client: the same API as `delayq.Client`, with coroutines."""

# `timeout` is the gRPC deadline sent to the server with each call, as grpc.aio
# itself names it; asyncio.timeout would not propagate it to the server.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import grpc
from grpc import aio

from delayq import _convert
from delayq._backoff import Backoff
from delayq._batcher import AsyncBatcher, Batching, Outcome, resolve
from delayq._channel import (
    MAX_BATCH_BYTES,
    MAX_BATCH_ITEMS,
    auth_metadata,
    channel_options,
    resolve_target,
)
from delayq._common import (
    RETRYABLE,
    DeadPage,
    all_idempotent,
    batch_outcomes,
    chunk_requests,
    collect_batch,
    finish_batch,
    stream_outcomes,
)
from delayq._convert import DurationLike
from delayq._enqueue_stream import EnqueueStream
from delayq._trace import current_context
from delayq.errors import DeadlineExceededError, DelayqError, from_rpc_error
from delayq.models import Delivery, EnqueueResult, Job, JobState, QueueStats, RetryPolicy
from delayq.serializers import JsonSerializer, Serializer
from delayq.v1 import service_pb2, service_pb2_grpc

__all__ = ["AsyncClient"]

_Resp = TypeVar("_Resp")


class AsyncClient:
    """An asyncio delayq client over one grpc.aio channel.

    Same behaviour as `delayq.Client` (deadlines, retries on UNAVAILABLE where
    a repeat is safe, DelayqError subclasses). Create it inside a running loop
    and use ``async with``, or `await close()` (which sends what is gathering).

    `batching` is on by default: concurrent `enqueue` calls travel together in
    EnqueueBatch calls, each still getting its own result or error. A call
    made while no batch call is in flight goes out after the current loop turn,
    so a lone caller waits no longer; see `delayq.Batching`. Pass
    ``batching=False`` for one Enqueue call per job.
    """

    def __init__(
        self,
        target: str | None = None,
        *,
        namespace: str = "default",
        timeout: float = 10.0,
        serializer: Serializer | None = None,
        retry_backoff: Backoff | None = None,
        retry_deadline: float = 30.0,
        credentials: grpc.ChannelCredentials | None = None,
        token: str | None = None,
        options: Sequence[tuple[str, Any]] = (),
        channel: aio.Channel | None = None,
        batching: Batching | bool | None = None,
    ) -> None:
        self.namespace = namespace
        self.timeout = timeout
        self._metadata = auth_metadata(token)
        self.serializer: Serializer = serializer or JsonSerializer()
        self._backoff = retry_backoff or Backoff()
        self._retry_deadline = retry_deadline
        self._own_channel = channel is None
        if channel is None:
            target = resolve_target(target)
            opts = channel_options(options)
            channel = (
                aio.secure_channel(target, credentials, options=opts)
                if credentials is not None
                else aio.insecure_channel(target, options=opts)
            )
        self._channel = channel
        self._stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        settings = resolve(batching, default=True)
        self._batcher = None if settings is None else AsyncBatcher(self._send_enqueues, settings)
        self._stream = (
            EnqueueStream(self._stub, self._metadata)
            if settings is not None and settings.stream
            else None
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Send the enqueues still gathering, then close the channel (when the client made it)."""
        if self._batcher is not None:
            await self._batcher.close()
        if self._stream is not None:
            await self._stream.close()
        if self._own_channel:
            await self._channel.close(None)

    async def _call(
        self,
        method: Callable[..., Awaitable[_Resp]],
        request: Any,
        *,
        idempotent: bool,
        timeout: float | None,
        retry_deadline: float | None = None,
    ) -> _Resp:
        async def once() -> _Resp:
            try:
                return await method(
                    request,
                    timeout=timeout if timeout is not None else self.timeout,
                    metadata=self._metadata,
                )
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None

        return await self._retrying(once, idempotent=idempotent, retry_deadline=retry_deadline)

    async def _retrying(
        self,
        once: Callable[[], Awaitable[_Resp]],
        *,
        idempotent: bool,
        retry_deadline: float | None = None,
    ) -> _Resp:
        """`once()` again after a RETRYABLE DelayqError, with backoff, while a repeat is
        safe (`idempotent`) and the retry budget lasts: unary calls and stream batches."""
        started = time.monotonic()
        budget = self._retry_deadline if retry_deadline is None else retry_deadline
        attempt = 0
        while True:
            try:
                return await once()
            except DelayqError as err:
                wait = self._backoff.delay(attempt)
                if (
                    not idempotent
                    or err.code not in RETRYABLE
                    or time.monotonic() - started + wait > budget
                ):
                    raise
            await asyncio.sleep(wait)
            attempt += 1

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        delay: DurationLike | None = None,
        at: datetime | None = None,
        ttl: DurationLike | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> EnqueueResult:
        """Store one job; see `delayq.Client.enqueue`."""
        req = _convert.enqueue_request(
            self.namespace,
            queue,
            payload,
            self.serializer,
            delay=delay,
            at=at,
            ttl=ttl,
            max_attempts=max_attempts,
            retry=retry,
            headers=headers,
            idempotency_key=idempotency_key,
        )
        if self._batcher is None:
            resp = await self._call(
                self._stub.Enqueue, req, idempotent=bool(idempotency_key), timeout=timeout
            )
            return _convert.enqueue_result(resp)
        context = current_context()  # a gathered batch carries no per-caller metadata
        if context is not None:
            for key, value in context.items():
                if key not in req.headers:
                    req.headers[key] = value
        fut = self._batcher.submit(req, self.timeout if timeout is None else timeout)
        if timeout is None:  # the batch call's own deadline bounds the wait
            result: EnqueueResult = await fut
            return result
        try:
            async with asyncio.timeout(timeout):
                result = await fut
        except TimeoutError:
            raise DeadlineExceededError(f"enqueue took longer than {timeout} s") from None
        return result

    async def _send_enqueues(
        self, requests: list[service_pb2.EnqueueRequest], timeout: float
    ) -> list[Outcome]:
        """The batcher's sender: a message on the EnqueueStream, or (stream off or
        not served) one Enqueue for a lone job, else one EnqueueBatch."""
        idempotent = all_idempotent(requests)
        if self._stream is not None and not self._stream.unsupported:
            outcomes = await self._send_on_stream(self._stream, requests, timeout, idempotent)
            if outcomes is not None:
                return outcomes
        if len(requests) == 1:
            try:
                resp = await self._call(
                    self._stub.Enqueue, requests[0], idempotent=idempotent, timeout=timeout
                )
            except DelayqError as err:
                return [err]
            return [_convert.enqueue_result(resp)]
        batch = await self._call(
            self._stub.EnqueueBatch,
            service_pb2.EnqueueBatchRequest(requests=requests),
            idempotent=idempotent,
            timeout=timeout,
        )
        return batch_outcomes(batch, len(requests))

    async def _send_on_stream(
        self,
        stream: EnqueueStream,
        requests: list[service_pb2.EnqueueRequest],
        timeout: float,
        idempotent: bool,
    ) -> list[Outcome] | None:
        """One batch on the stream, re-sent on a new stream after UNAVAILABLE when
        every job has an idempotency key (as `_call` retries a unary call). None when
        the server does not serve EnqueueStream: nothing was stored, use calls."""
        try:
            resp = await self._retrying(
                lambda: stream.send(requests, timeout), idempotent=idempotent
            )
        except DelayqError:
            if stream.unsupported:  # UNIMPLEMENTED is never retried
                return None
            raise
        return stream_outcomes(resp, len(requests))

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        delay: DurationLike | None = None,
        at: datetime | None = None,
        ttl: DurationLike | None = None,
        max_attempts: int | None = None,
        retry: RetryPolicy | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        concurrency: int = 4,
        on_progress: Callable[[int], None] | None = None,
    ) -> list[EnqueueResult]:
        """Store many jobs; see `delayq.Client.enqueue_many`.

        Up to `concurrency` EnqueueBatch calls are in flight at once; results
        still come back in input order.
        """
        defaults: dict[str, Any] = {
            "delay": delay,
            "at": at,
            "ttl": ttl,
            "max_attempts": max_attempts,
            "retry": retry,
            "headers": headers,
        }
        requests = _convert.batch_requests(
            self.namespace, queue, payloads, self.serializer, defaults
        )
        chunks = list(chunk_requests(requests, MAX_BATCH_ITEMS, MAX_BATCH_BYTES))
        gate = asyncio.Semaphore(max(1, concurrency))

        async def send(chunk: list[service_pb2.EnqueueRequest]) -> Any:
            async with gate:
                resp = await self._call(
                    self._stub.EnqueueBatch,
                    service_pb2.EnqueueBatchRequest(requests=chunk),
                    idempotent=all_idempotent(chunk),
                    timeout=timeout,
                )
                if on_progress is not None:
                    on_progress(len(chunk))
                return resp

        responses = await asyncio.gather(*(send(c) for c in chunks))
        results: list[EnqueueResult | None] = []
        errors: dict[int, DelayqError] = {}
        for resp in responses:
            collect_batch(resp, len(results), results, errors)
        return finish_batch(results, errors)

    async def get(self, queue: str, job_id: str, *, timeout: float | None = None) -> Job:
        """Return one job in any state; raises NotFoundError when there is none."""
        req = service_pb2.QueryRequest(namespace=self.namespace, queue=queue, job_id=job_id)
        resp = await self._call(self._stub.Query, req, idempotent=True, timeout=timeout)
        return _convert.job_from_proto(resp.job, self.serializer)

    async def delete(self, queue: str, job_id: str, *, timeout: float | None = None) -> JobState:
        """Delete a job in any state and return the state it was in."""
        req = service_pb2.DeleteRequest(namespace=self.namespace, queue=queue, job_id=job_id)
        resp = await self._call(self._stub.Delete, req, idempotent=False, timeout=timeout)
        return JobState(resp.previous_state)

    async def stats(self, queue: str, *, timeout: float | None = None) -> QueueStats:
        """Counts per state and lifetime counters of one queue."""
        req = service_pb2.GetQueueStatsRequest(namespace=self.namespace, queue=queue)
        resp = await self._call(self._stub.GetQueueStats, req, idempotent=True, timeout=timeout)
        return _convert.stats_from_proto(resp.stats)

    async def list_dead(
        self,
        queue: str,
        *,
        page_size: int = 100,
        page_token: str = "",
        timeout: float | None = None,
    ) -> DeadPage:
        """One page of the queue's dead-letter set, oldest death first."""
        req = service_pb2.ListDeadJobsRequest(
            namespace=self.namespace, queue=queue, page_size=page_size, page_token=page_token
        )
        resp = await self._call(self._stub.ListDeadJobs, req, idempotent=True, timeout=timeout)
        return DeadPage(
            jobs=[_convert.job_from_proto(j, self.serializer) for j in resp.jobs],
            next_page_token=resp.next_page_token,
        )

    async def redrive_dead(
        self,
        queue: str,
        job_ids: Sequence[str] = (),
        *,
        limit: int = 0,
        timeout: float | None = None,
    ) -> int:
        """Move dead jobs (the given ids, or all up to `limit`) back to ready."""
        req = service_pb2.RedriveDeadJobsRequest(
            namespace=self.namespace, queue=queue, job_ids=list(job_ids), limit=limit
        )
        resp = await self._call(
            self._stub.RedriveDeadJobs, req, idempotent=bool(job_ids), timeout=timeout
        )
        return resp.redriven

    async def purge_dead(
        self,
        queue: str,
        job_ids: Sequence[str] = (),
        *,
        limit: int = 0,
        timeout: float | None = None,
    ) -> int:
        """Delete dead jobs (the given ids, or all up to `limit`) for good."""
        req = service_pb2.PurgeDeadJobsRequest(
            namespace=self.namespace, queue=queue, job_ids=list(job_ids), limit=limit
        )
        resp = await self._call(
            self._stub.PurgeDeadJobs, req, idempotent=bool(job_ids), timeout=timeout
        )
        return resp.purged

    def consume_call(
        self,
        queues: Sequence[str],
        *,
        max_outstanding: int,
        lease: DurationLike | None = None,
        max_batch: int = 0,
        release_grace: DurationLike | None = None,
    ) -> aio.UnaryStreamCall[service_pb2.ConsumeRequest, service_pb2.ConsumeResponse]:
        """Open a raw Consume stream (for `delayq.Worker` and tools that cancel it themselves)."""
        req = _convert.consume_request(
            self.namespace, queues, max_outstanding, lease, max_batch, release_grace
        )
        return self._stub.Consume(req, metadata=self._metadata)

    async def consume(
        self,
        queues: Sequence[str],
        *,
        max_outstanding: int = 100,
        lease: DurationLike | None = None,
        max_batch: int = 0,
        release_grace: DurationLike | None = None,
    ) -> AsyncIterator[Delivery]:
        """Yield deliveries from a Consume stream; see `delayq.Client.consume`."""
        call = self.consume_call(
            queues,
            max_outstanding=max_outstanding,
            lease=lease,
            max_batch=max_batch,
            release_grace=release_grace,
        )
        try:
            async for msg in call:
                for d in msg.deliveries:
                    yield _convert.delivery_from_proto(d, self.serializer)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(exc) from None
        finally:
            call.cancel()

    async def ack(
        self,
        lease_tokens: Sequence[str],
        *,
        timeout: float | None = None,
        retry_deadline: float | None = None,
    ) -> list[int]:
        """Complete deliveries; returns one delayq.v1.AckResult value per token."""
        req = service_pb2.AckRequest(lease_tokens=list(lease_tokens))
        resp = await self._call(
            self._stub.Ack, req, idempotent=True, timeout=timeout, retry_deadline=retry_deadline
        )
        return list(resp.results)

    async def release(
        self,
        lease_tokens: Sequence[str],
        *,
        timeout: float | None = None,
        retry_deadline: float | None = None,
    ) -> list[int]:
        """Give deliveries back unstarted; see `delayq.Client.release`."""
        req = service_pb2.ReleaseRequest(lease_tokens=list(lease_tokens))
        resp = await self._call(
            self._stub.Release,
            req,
            idempotent=True,
            timeout=timeout,
            retry_deadline=retry_deadline,
        )
        return list(resp.results)

    async def nack(
        self,
        lease_token: str,
        *,
        delay: DurationLike | None = None,
        dead_letter: bool = False,
        reason: str = "",
        timeout: float | None = None,
    ) -> JobState:
        """Give a delivery back: retried after `delay` (or by policy), or dead-lettered."""
        req = service_pb2.NackRequest(
            lease_token=lease_token, dead_letter=dead_letter, reason=reason
        )
        if delay is not None:
            req.delay.CopyFrom(_convert.to_duration(delay))
        resp = await self._call(self._stub.Nack, req, idempotent=False, timeout=timeout)
        return JobState(resp.state)

    async def extend_lease(
        self,
        lease_token: str,
        extension: DurationLike,
        *,
        timeout: float | None = None,
        retry_deadline: float | None = None,
    ) -> datetime:
        """Push a delivery's lease deadline to now + `extension`; returns the new deadline."""
        req = service_pb2.ExtendLeaseRequest(
            lease_token=lease_token, extension=_convert.to_duration(extension)
        )
        resp = await self._call(
            self._stub.ExtendLease,
            req,
            idempotent=True,
            timeout=timeout,
            retry_deadline=retry_deadline,
        )
        return _convert.from_timestamp(resp.lease_deadline)
