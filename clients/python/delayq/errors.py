"""Exceptions raised by the delayq client: one class per canonical gRPC status."""

from __future__ import annotations

import grpc

__all__ = [
    "AlreadyExistsError",
    "CancelledError",
    "DeadlineExceededError",
    "DelayqError",
    "EnqueueBatchError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "from_rpc_error",
    "from_status",
]


class DelayqError(Exception):
    """A call failed with a gRPC status; `code` and `message` come from the server."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class CancelledError(DelayqError):
    """The call was cancelled (CANCELLED)."""

    code = grpc.StatusCode.CANCELLED


class InvalidArgumentError(DelayqError):
    """The request was malformed; the message names the field (INVALID_ARGUMENT)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(DelayqError):
    """The call's deadline passed before an answer came (DEADLINE_EXCEEDED)."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(DelayqError):
    """No such job or lease token (NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(DelayqError):
    """ALREADY_EXISTS."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(DelayqError):
    """The caller may not do this (PERMISSION_DENIED)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(DelayqError):
    """Redis is out of memory or a limit was hit (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(DelayqError):
    """A stale lease token: the lease ran out and the job moved on (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class InternalError(DelayqError):
    """The server failed (INTERNAL)."""

    code = grpc.StatusCode.INTERNAL


class UnavailableError(DelayqError):
    """The server or its Redis cannot be reached (UNAVAILABLE)."""

    code = grpc.StatusCode.UNAVAILABLE


class UnauthenticatedError(DelayqError):
    """Missing or bad credentials (UNAUTHENTICATED)."""

    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[DelayqError]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        InternalError,
        UnavailableError,
        UnauthenticatedError,
    )
}
_BY_VALUE: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def from_status(code: grpc.StatusCode | int, message: str) -> DelayqError:
    """Build the exception for a status code (an enum member or its number)."""
    if isinstance(code, int):
        code = _BY_VALUE.get(code, grpc.StatusCode.UNKNOWN)
    cls = _BY_CODE.get(code, DelayqError)
    return cls(message, code)


def from_rpc_error(exc: grpc.RpcError) -> DelayqError:
    """Translate a grpc.RpcError (sync or aio) into a DelayqError."""
    code_fn = getattr(exc, "code", None)
    details_fn = getattr(exc, "details", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details = details_fn() if callable(details_fn) else None
    return from_status(code or grpc.StatusCode.UNKNOWN, details or str(exc))


class EnqueueBatchError(DelayqError):
    """Some jobs of an `enqueue_many` call were refused; the others were stored.

    `results[i]` is the outcome of item i (None when refused) and `errors[i]`
    the refusal of item i.
    """

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, results: list[object | None], errors: dict[int, DelayqError]) -> None:
        first_index, first = next(iter(sorted(errors.items())))
        super().__init__(
            f"{len(errors)} of {len(results)} jobs refused; first, item {first_index}: {first}",
            first.code,
        )
        self.results = results
        self.errors = errors
