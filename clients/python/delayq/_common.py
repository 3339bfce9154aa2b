"""Pieces shared by Client and AsyncClient: batching, result mapping, retry decisions."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc

from delayq import _convert
from delayq.errors import DelayqError, EnqueueBatchError, from_status
from delayq.models import EnqueueResult, Job
from delayq.v1 import service_pb2

__all__ = [
    "AckOutcome",
    "DeadPage",
    "ReleaseOutcome",
    "batch_outcomes",
    "chunk_requests",
    "collect_batch",
]

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class DeadPage:
    """One page of dead jobs; `next_page_token` is empty at the end."""

    jobs: list[Job]
    next_page_token: str


class AckOutcome:
    """Names of delayq.v1.AckResult values."""

    ACKED = service_pb2.ACK_RESULT_ACKED
    STALE = service_pb2.ACK_RESULT_STALE
    UNKNOWN = service_pb2.ACK_RESULT_UNKNOWN


class ReleaseOutcome:
    """Names of delayq.v1.ReleaseResult values."""

    RELEASED = service_pb2.RELEASE_RESULT_RELEASED
    STALE = service_pb2.RELEASE_RESULT_STALE
    UNKNOWN = service_pb2.RELEASE_RESULT_UNKNOWN


def chunk_requests(
    requests: Sequence[service_pb2.EnqueueRequest], max_items: int, max_bytes: int
) -> Iterator[list[service_pb2.EnqueueRequest]]:
    """Split requests into EnqueueBatch-sized chunks by count and encoded size."""
    chunk: list[service_pb2.EnqueueRequest] = []
    size = 0
    for req in requests:
        req_size = req.ByteSize() + 8
        if chunk and (len(chunk) >= max_items or size + req_size > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(req)
        size += req_size
    if chunk:
        yield chunk


def all_idempotent(chunk: Sequence[service_pb2.EnqueueRequest]) -> bool:
    """A batch may be repeated only when every job in it carries an idempotency key."""
    return all(req.idempotency_key for req in chunk)


def collect_batch(
    response: service_pb2.EnqueueBatchResponse,
    offset: int,
    results: list[EnqueueResult | None],
    errors: dict[int, DelayqError],
) -> None:
    """Record one EnqueueBatch response at `offset` into results/errors."""
    for i, item in enumerate(response.results):
        if item.HasField("error"):
            errors[offset + i] = from_status(item.error.code, item.error.message)
            results.append(None)
        else:
            results.append(_convert.enqueue_result(item.response))


def batch_outcomes(
    response: service_pb2.EnqueueBatchResponse | service_pb2.EnqueueStreamResponse, count: int
) -> list[EnqueueResult | DelayqError]:
    """One EnqueueBatch (or EnqueueStream) answer -> one result or error per request,
    index-aligned."""
    if len(response.results) != count:
        err = from_status(
            grpc.StatusCode.INTERNAL,
            f"EnqueueBatch answered {len(response.results)} results for {count} jobs",
        )
        return [err] * count
    return [
        from_status(item.error.code, item.error.message)
        if item.HasField("error")
        else _convert.enqueue_result(item.response)
        for item in response.results
    ]


def stream_outcomes(
    response: service_pb2.EnqueueStreamResponse, count: int
) -> list[EnqueueResult | DelayqError]:
    """One EnqueueStream answer -> its outcomes; raises the whole batch's refusal (its
    `error`: nothing of the batch was stored)."""
    if response.HasField("error"):
        raise from_status(response.error.code, response.error.message)
    return batch_outcomes(response, count)


def finish_batch(
    results: list[EnqueueResult | None], errors: dict[int, DelayqError]
) -> list[EnqueueResult]:
    """Return the results, or raise EnqueueBatchError when any job was refused."""
    if errors:
        raise EnqueueBatchError(list(results), errors)
    return [r for r in results if r is not None]
