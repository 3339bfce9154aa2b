"""Blocking client: enqueue, inspect, delete and administer jobs."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import grpc

from delayq import _convert
from delayq._backoff import Backoff
from delayq._batcher import Batching, Outcome, ThreadBatcher, resolve
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
from delayq._enqueue_stream_sync import ThreadEnqueueStream
from delayq.errors import DeadlineExceededError, DelayqError, from_rpc_error
from delayq.models import Delivery, EnqueueResult, Job, JobState, QueueStats, RetryPolicy
from delayq.serializers import JsonSerializer, Serializer
from delayq.v1 import service_pb2, service_pb2_grpc

__all__ = ["Client"]

_Resp = TypeVar("_Resp")


class Client:
    """A blocking delayq client over one gRPC channel.

    Every call has a deadline (`timeout` seconds unless the call passes its own).
    Calls that are safe to repeat (reads, enqueues carrying an idempotency key,
    acks, lease extensions) are retried on UNAVAILABLE with jittered backoff for
    up to `retry_deadline` seconds; other calls raise at once. Errors are raised
    as `delayq.errors.DelayqError` subclasses named for the gRPC status.

    `batching` gathers concurrent `enqueue` calls from many threads into
    EnqueueBatch calls (`delayq.Batching`; True for the defaults). It is off
    here by default: it needs a collector thread and helps only callers that
    enqueue from several threads at once. Each call still gets its own result
    or error.

    Use as a context manager, or call `close()` (which sends what is gathering).
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
        channel: grpc.Channel | None = None,
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
                grpc.secure_channel(target, credentials, options=opts)
                if credentials is not None
                else grpc.insecure_channel(target, options=opts)
            )
        self._channel = channel
        self._stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        settings = resolve(batching, default=False)
        self._batcher = None if settings is None else ThreadBatcher(self._send_enqueues, settings)
        self._stream = (
            ThreadEnqueueStream(self._stub, self._metadata)
            if settings is not None and settings.stream
            else None
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Send the enqueues still gathering, then close the channel (when the client made it)."""
        if self._batcher is not None:
            self._batcher.close()
        if self._stream is not None:
            self._stream.close()
        if self._own_channel:
            self._channel.close()

    def _call(
        self,
        method: Callable[..., _Resp],
        request: Any,
        *,
        idempotent: bool,
        timeout: float | None,
    ) -> _Resp:
        def once() -> _Resp:
            try:
                return method(
                    request,
                    timeout=timeout if timeout is not None else self.timeout,
                    metadata=self._metadata,
                )
            except grpc.RpcError as exc:
                raise from_rpc_error(exc) from None

        return self._retrying(once, idempotent=idempotent)

    def _retrying(self, once: Callable[[], _Resp], *, idempotent: bool) -> _Resp:
        """`once()` again after a RETRYABLE DelayqError, with backoff, while a repeat is
        safe (`idempotent`) and the retry budget lasts: unary calls and stream batches."""
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                return once()
            except DelayqError as err:
                wait = self._backoff.delay(attempt)
                if (
                    not idempotent
                    or err.code not in RETRYABLE
                    or time.monotonic() - started + wait > self._retry_deadline
                ):
                    raise
            time.sleep(wait)
            attempt += 1

    def enqueue(
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
        """Store one job, due after `delay` (timedelta or seconds) or `at` (datetime).

        `payload` may be bytes (stored as is), str (UTF-8) or any object the
        serializer accepts (JSON by default). With an `idempotency_key`, a repeat
        within the server's window returns the first job's id with
        `duplicate=True`, and the call is retried on UNAVAILABLE.
        """
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
            resp = self._call(
                self._stub.Enqueue, req, idempotent=bool(idempotency_key), timeout=timeout
            )
            return _convert.enqueue_result(resp)
        fut = self._batcher.submit(req, self.timeout if timeout is None else timeout)
        try:
            result: EnqueueResult = fut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise DeadlineExceededError(f"enqueue took longer than {timeout} s") from None
        return result

    def _send_enqueues(
        self, requests: list[service_pb2.EnqueueRequest], timeout: float
    ) -> list[Outcome]:
        """The batcher's sender: a message on the EnqueueStream, or (stream off or
        not served) one Enqueue for a lone job, else one EnqueueBatch."""
        idempotent = all_idempotent(requests)
        if self._stream is not None and not self._stream.unsupported:
            outcomes = self._send_on_stream(self._stream, requests, timeout, idempotent)
            if outcomes is not None:
                return outcomes
        if len(requests) == 1:
            try:
                resp = self._call(
                    self._stub.Enqueue, requests[0], idempotent=idempotent, timeout=timeout
                )
            except DelayqError as err:
                return [err]
            return [_convert.enqueue_result(resp)]
        batch = self._call(
            self._stub.EnqueueBatch,
            service_pb2.EnqueueBatchRequest(requests=requests),
            idempotent=idempotent,
            timeout=timeout,
        )
        return batch_outcomes(batch, len(requests))

    def _send_on_stream(
        self,
        stream: ThreadEnqueueStream,
        requests: list[service_pb2.EnqueueRequest],
        timeout: float,
        idempotent: bool,
    ) -> list[Outcome] | None:
        """One batch on the stream, re-sent on a new stream after UNAVAILABLE when
        every job has an idempotency key (as `_call` retries a unary call). None when
        the server does not serve EnqueueStream: nothing was stored, use calls."""
        try:
            resp = self._retrying(lambda: stream.send(requests, timeout), idempotent=idempotent)
        except DelayqError:
            if stream.unsupported:  # UNIMPLEMENTED is never retried
                return None
            raise
        return stream_outcomes(resp, len(requests))

    def enqueue_many(
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
        on_progress: Callable[[int], None] | None = None,
    ) -> list[EnqueueResult]:
        """Store many jobs with EnqueueBatch calls of up to 1000 jobs each.

        Items are payloads, or `delayq.Message` objects carrying their own
        options (queue, delay, idempotency key...). Results come back in order.
        When some jobs are refused the others are still stored, and
        `EnqueueBatchError` is raised after all batches were sent, carrying
        every result and error by index. `on_progress(n)` is called after each
        batch with the number of jobs it held.
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
        results: list[EnqueueResult | None] = []
        errors: dict[int, DelayqError] = {}
        for chunk in chunk_requests(requests, MAX_BATCH_ITEMS, MAX_BATCH_BYTES):
            resp = self._call(
                self._stub.EnqueueBatch,
                service_pb2.EnqueueBatchRequest(requests=chunk),
                idempotent=all_idempotent(chunk),
                timeout=timeout,
            )
            collect_batch(resp, len(results), results, errors)
            if on_progress is not None:
                on_progress(len(chunk))
        return finish_batch(results, errors)

    def get(self, queue: str, job_id: str, *, timeout: float | None = None) -> Job:
        """Return one job in any state; raises NotFoundError when there is none."""
        req = service_pb2.QueryRequest(namespace=self.namespace, queue=queue, job_id=job_id)
        resp = self._call(self._stub.Query, req, idempotent=True, timeout=timeout)
        return _convert.job_from_proto(resp.job, self.serializer)

    def delete(self, queue: str, job_id: str, *, timeout: float | None = None) -> JobState:
        """Delete a job in any state and return the state it was in."""
        req = service_pb2.DeleteRequest(namespace=self.namespace, queue=queue, job_id=job_id)
        resp = self._call(self._stub.Delete, req, idempotent=False, timeout=timeout)
        return JobState(resp.previous_state)

    def stats(self, queue: str, *, timeout: float | None = None) -> QueueStats:
        """Counts per state and lifetime counters of one queue."""
        req = service_pb2.GetQueueStatsRequest(namespace=self.namespace, queue=queue)
        resp = self._call(self._stub.GetQueueStats, req, idempotent=True, timeout=timeout)
        return _convert.stats_from_proto(resp.stats)

    def list_dead(
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
        resp = self._call(self._stub.ListDeadJobs, req, idempotent=True, timeout=timeout)
        return DeadPage(
            jobs=[_convert.job_from_proto(j, self.serializer) for j in resp.jobs],
            next_page_token=resp.next_page_token,
        )

    def iter_dead(self, queue: str, *, page_size: int = 100) -> Iterator[Job]:
        """Every dead job of the queue, fetched page by page."""
        token = ""
        while True:
            page = self.list_dead(queue, page_size=page_size, page_token=token)
            yield from page.jobs
            token = page.next_page_token
            if not token:
                return

    def redrive_dead(
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
        resp = self._call(
            self._stub.RedriveDeadJobs, req, idempotent=bool(job_ids), timeout=timeout
        )
        return resp.redriven

    def purge_dead(
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
        resp = self._call(self._stub.PurgeDeadJobs, req, idempotent=bool(job_ids), timeout=timeout)
        return resp.purged

    def consume(
        self,
        queues: Sequence[str],
        *,
        max_outstanding: int = 100,
        lease: DurationLike | None = None,
        max_batch: int = 0,
        release_grace: DurationLike | None = None,
    ) -> Iterator[Delivery]:
        """Open a Consume stream and yield deliveries until the iterator is closed.

        The caller must `ack`/`nack` each delivery (or `release` it unstarted);
        the stream never holds more than `max_outstanding` un-acked ones. Closing
        the iterator closes the stream, and the server puts its still-leased jobs
        back to ready, counting their attempts, after `release_grace` (at once
        when unset). To give deliveries back uncounted, close the iterator with a
        grace set and then `release` their tokens.
        For handlers, retries, renewal and shutdown use `delayq.Worker`.
        """
        req = _convert.consume_request(
            self.namespace, queues, max_outstanding, lease, max_batch, release_grace
        )
        call = self._stub.Consume(req, metadata=self._metadata)
        try:
            for msg in call:
                for d in msg.deliveries:
                    yield _convert.delivery_from_proto(d, self.serializer)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(exc) from None
        finally:
            call.cancel()  # type: ignore[no-untyped-call]

    def ack(self, lease_tokens: Sequence[str], *, timeout: float | None = None) -> list[int]:
        """Complete deliveries; returns one delayq.v1.AckResult value per token."""
        req = service_pb2.AckRequest(lease_tokens=list(lease_tokens))
        resp = self._call(self._stub.Ack, req, idempotent=True, timeout=timeout)
        return list(resp.results)

    def release(self, lease_tokens: Sequence[str], *, timeout: float | None = None) -> list[int]:
        """Give deliveries back unstarted: ready again, attempts not counted.

        Returns one delayq.v1.ReleaseResult value per token (RELEASED, or STALE /
        UNKNOWN for tokens no longer current). Safe to repeat, so retried on
        UNAVAILABLE. Release after closing the stream (with a `release_grace`),
        or the server may deliver the jobs to that stream again.
        """
        req = service_pb2.ReleaseRequest(lease_tokens=list(lease_tokens))
        resp = self._call(self._stub.Release, req, idempotent=True, timeout=timeout)
        return list(resp.results)

    def nack(
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
        resp = self._call(self._stub.Nack, req, idempotent=False, timeout=timeout)
        return JobState(resp.state)

    def extend_lease(
        self, lease_token: str, extension: DurationLike, *, timeout: float | None = None
    ) -> datetime:
        """Push a delivery's lease deadline to now + `extension`; returns the new deadline."""
        req = service_pb2.ExtendLeaseRequest(
            lease_token=lease_token, extension=_convert.to_duration(extension)
        )
        resp = self._call(self._stub.ExtendLease, req, idempotent=True, timeout=timeout)
        return _convert.from_timestamp(resp.lease_deadline)
