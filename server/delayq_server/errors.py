"""Domain errors and their one mapping to canonical gRPC status codes."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc
from redis import exceptions as redis_errors

from delayq_server.store import StaleLease, UnknownJob

log = logging.getLogger(__name__)


class DelayqError(Exception):
    """An error with a canonical status code and a message a caller can act on."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(DelayqError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(DelayqError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(DelayqError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(DelayqError):
    code = grpc.StatusCode.UNAVAILABLE


def to_status(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """Maps any exception to (code, message); unexpected ones are logged, not leaked."""
    if isinstance(exc, DelayqError):
        return exc.code, exc.message
    if isinstance(exc, UnknownJob):
        return grpc.StatusCode.NOT_FOUND, "lease_token: no such job (acked, deleted or expired)"
    if isinstance(exc, StaleLease):
        return (
            grpc.StatusCode.FAILED_PRECONDITION,
            "lease_token: stale lease: the lease ran out and the job was redelivered or retried",
        )
    if isinstance(exc, redis_errors.OutOfMemoryError) or (
        isinstance(exc, redis_errors.ResponseError) and str(exc).startswith("OOM")
    ):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, "Redis is out of memory; nothing was written"
    if isinstance(exc, redis_errors.ReadOnlyError):
        return grpc.StatusCode.UNAVAILABLE, "Redis is read-only (a replica?); retry later"
    if isinstance(exc, (redis_errors.ConnectionError, redis_errors.TimeoutError)):
        # The detail names Redis' address: logged here, never sent to callers.
        log.warning("Redis unavailable: %s", exc)
        return grpc.StatusCode.UNAVAILABLE, "Redis unavailable; retry later"
    if isinstance(
        exc,
        (
            redis_errors.ClusterDownError,
            redis_errors.TryAgainError,
            redis_errors.SlotNotCoveredError,
            redis_errors.MasterDownError,
        ),
    ):
        return grpc.StatusCode.UNAVAILABLE, "Redis Cluster is failing over; retry shortly"
    if isinstance(exc, redis_errors.BusyLoadingError):
        return grpc.StatusCode.UNAVAILABLE, "Redis is loading its dataset; retry later"
    log.exception("unexpected error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error (logged on the server)"


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> NoReturn:
    code, message = to_status(exc)
    retry_after_ms = getattr(exc, "retry_after_ms", None)
    if retry_after_ms is not None:  # quotas: when to retry, for programs
        context.set_trailing_metadata((("retry-after-ms", str(retry_after_ms)),))
    await context.abort(code, message)
    raise AssertionError("unreachable")  # context.abort raises


F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


def unary(fn: F) -> F:
    """Wraps a unary servicer method so every failure becomes a canonical status."""

    @functools.wraps(fn)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc)

    return wrapper  # type: ignore[return-value]


G = TypeVar("G", bound=Callable[..., AsyncIterator[Any]])


def streaming(fn: G) -> G:
    """Same as ``unary`` for server-streaming methods."""

    @functools.wraps(fn)
    async def wrapper(
        self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        try:
            async for item in fn(self, request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await abort(context, exc)

    return wrapper  # type: ignore[return-value]
