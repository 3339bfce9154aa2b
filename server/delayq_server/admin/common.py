"""What the queue and job operations share: their dependencies, refusals and lookups."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from delayq_server import errors, validation
from delayq_server.auth import principal as pr
from delayq_server.config import Config
from delayq_server.dispatcher import Dispatcher
from delayq_server.errors import InvalidArgument, NotFound
from delayq_server.quotas import Quotas
from delayq_server.store import Store
from delayq_server.store.jobs_admin import JobAdmin
from delayq_server.timers.manager import Timers


class AlreadyExists(errors.DelayqError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(errors.DelayqError):
    code = grpc.StatusCode.PERMISSION_DENIED


@dataclass(frozen=True, slots=True)
class Deps:
    """The server pieces the admin operations use."""

    cfg: Config
    store: Store
    jobs: JobAdmin
    timers: Timers
    dispatcher: Dispatcher | None = None
    quotas: Quotas | None = None


def queue_name(namespace: str, queue: str) -> tuple[str, str]:
    """Validated (namespace, queue); empty namespace = "default"."""
    return validation.namespace(namespace), validation.name("queue", queue)


async def existing_shards(deps: Deps, namespace: str, queue: str, field: str = "queue") -> int:
    """The shard count of an existing queue, else NOT_FOUND naming ``field``."""
    shards = await deps.store.shard_count(namespace, queue, create=False)
    if shards == 0:
        raise NotFound(f"{field}: no queue {namespace}/{queue} (see ListQueues)")
    return shards


def readable(namespace: str) -> bool:
    """Whether the caller may see this namespace (ListQueues filters by it)."""
    return pr.current().allows(namespace)


def page_size(value: int, *, default: int, hi: int) -> int:
    if value > hi:
        raise InvalidArgument("page_size", f"must be 0 to {hi}")
    return value or default
