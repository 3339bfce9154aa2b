"""Plain data types returned by the client: jobs, deliveries, stats, enqueue results."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

__all__ = [
    "Delivery",
    "EnqueueResult",
    "Job",
    "JobState",
    "Message",
    "QueueStats",
    "RetryPolicy",
]


class JobState(enum.IntEnum):
    """Where a job is in its lifecycle (mirrors delayq.v1.JobState)."""

    UNSPECIFIED = 0
    SCHEDULED = 1
    READY = 2
    LEASED = 3
    DEAD = 4
    COMPLETED = 5


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff between attempts; fields left unset take the server defaults.

    The n-th retry waits ``min(max_backoff, initial_backoff * multiplier**(n-1))``,
    shortened by a random fraction of at most `jitter`.
    """

    initial_backoff: timedelta | None = None
    max_backoff: timedelta | None = None
    multiplier: float = 0.0
    jitter: float = 0.0


@dataclass(frozen=True)
class Message:
    """One job for `enqueue_many` with its own options (unset ones take the call's)."""

    payload: Any
    delay: timedelta | float | None = None
    at: datetime | None = None
    ttl: timedelta | float | None = None
    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    headers: Mapping[str, str] | None = None
    idempotency_key: str | None = None
    queue: str | None = None


@dataclass(frozen=True)
class EnqueueResult:
    """Where an enqueued job went."""

    job_id: str
    due_time: datetime | None
    duplicate: bool = False


@dataclass(frozen=True)
class Job:
    """A job as stored by the server; `payload` is decoded on first access."""

    id: str
    namespace: str
    queue: str
    state: JobState
    data: bytes
    headers: Mapping[str, str]
    attempts: int
    max_attempts: int
    retry: RetryPolicy | None
    create_time: datetime | None
    due_time: datetime | None
    expire_time: datetime | None
    last_delivery_time: datetime | None
    finish_time: datetime | None
    last_error: str
    _decode: Callable[[bytes, Mapping[str, str]], Any] = field(
        default=lambda data, headers: data, repr=False, compare=False
    )

    @cached_property
    def payload(self) -> Any:
        """The payload decoded by its content-type header (bytes when it has none)."""
        return self._decode(self.data, self.headers)


@dataclass(frozen=True)
class Delivery:
    """One leased job handed to a handler (or yielded by `consume`)."""

    job: Job
    lease_token: str
    attempt: int
    lease_deadline: datetime | None

    @property
    def id(self) -> str:
        """The job id."""
        return self.job.id

    @property
    def queue(self) -> str:
        """The queue the job came from."""
        return self.job.queue

    @property
    def payload(self) -> Any:
        """The decoded payload."""
        return self.job.payload

    @property
    def headers(self) -> Mapping[str, str]:
        """The job's headers."""
        return self.job.headers


@dataclass(frozen=True)
class QueueStats:
    """Counts per state of one queue and lifetime counters."""

    namespace: str
    queue: str
    scheduled: int
    ready: int
    leased: int
    dead: int
    completed: int
    oldest_ready_age: timedelta
    next_due_time: datetime | None
    shards: int
    enqueued_total: int
    acked_total: int
    retried_total: int
    dead_lettered_total: int
    expired_total: int
