"""delayq: Python client, asyncio client and worker runtime for the delayq job queue."""

from delayq._backoff import Backoff
from delayq._batcher import Batching
from delayq._common import DeadPage
from delayq.aio import AsyncClient
from delayq.client import Client
from delayq.errors import (
    DelayqError,
    EnqueueBatchError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    UnavailableError,
)
from delayq.models import (
    Delivery,
    EnqueueResult,
    Job,
    JobState,
    Message,
    QueueStats,
    RetryPolicy,
)
from delayq.outcomes import DeadLetter, Retry
from delayq.serializers import JsonSerializer, Serializer
from delayq.worker import Worker, WorkerStats

__all__ = [
    "AsyncClient",
    "Backoff",
    "Batching",
    "Client",
    "DeadLetter",
    "DeadPage",
    "DelayqError",
    "Delivery",
    "EnqueueBatchError",
    "EnqueueResult",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "Job",
    "JobState",
    "JsonSerializer",
    "Message",
    "NotFoundError",
    "QueueStats",
    "ResourceExhaustedError",
    "Retry",
    "RetryPolicy",
    "Serializer",
    "UnavailableError",
    "Worker",
    "WorkerStats",
]

__version__ = "0.1.0"
