"""Queue operations: list, create, get, update, delete, pause, resume, purge (issue 14)."""

from __future__ import annotations

from delayq.v1 import admin_pb2, job_pb2
from delayq_server import convert, validation
from delayq_server.admin.common import (
    AlreadyExists,
    Deps,
    existing_shards,
    page_size,
    queue_name,
    readable,
)
from delayq_server.admin.push_target import push_in, push_out
from delayq_server.errors import FailedPrecondition, InvalidArgument
from delayq_server.queue_stats import summed_stats
from delayq_server.store import ShardKeys
from delayq_server.store.jobs_admin import PURGE_LIMIT
from delayq_server.store.queues import (
    F_ATTEMPTS,
    F_COMPLETED,
    F_DEAD_AGE,
    F_DEAD_MAX,
    F_LEASE,
    F_PUSH,
    F_RETRY,
    QueueSettings,
    Retry,
)
from delayq_server.store.records import JobState

DAY_MS = 86_400_000
MAX_DEAD_JOBS = 100_000_000
# PurgeQueue: states in the order a whole-queue purge takes them (waiting work
# first, so a purge under way stops deliveries soonest).
PURGE_ORDER = (
    JobState.SCHEDULED,
    JobState.READY,
    JobState.LEASED,
    JobState.DEAD,
    JobState.COMPLETED,
)
# UpdateQueue paths -> meta fields
MASK_FIELDS = {
    "default_lease": F_LEASE,
    "max_attempts": F_ATTEMPTS,
    "retry": F_RETRY,
    "completed_retention": F_COMPLETED,
    "dead_retention": F_DEAD_AGE,
    "dead_max_jobs": F_DEAD_MAX,
    "push": F_PUSH,
}


def settings_in(
    deps: Deps,
    m: admin_pb2.QueueSettings,
    *,
    shards: int,
    queue: tuple[str, str],
    current_push: str | None = None,
) -> QueueSettings:
    """Validates settings from a request; field names as the caller wrote them.
    ``current_push`` is the queue's stored target (its secret is kept when the
    request gives none)."""
    p = "settings."
    lease = 0
    if m.HasField("default_lease"):
        lease = validation.duration_ms(
            p + "default_lease",
            m.default_lease,
            lo=validation.MIN_LEASE_MS,
            hi=validation.MAX_LEASE_MS,
        )
    if m.max_attempts > validation.MAX_ATTEMPTS:
        raise InvalidArgument(
            p + "max_attempts", f"must be 1 to {validation.MAX_ATTEMPTS} (0 = server default)"
        )
    retry = None
    if m.HasField("retry"):
        retry = Retry(*validation.retry(m.retry, deps.cfg, p + "retry."))
    completed = None
    if m.HasField("completed_retention"):
        completed = validation.duration_ms(
            p + "completed_retention", m.completed_retention, lo=0, hi=366 * DAY_MS
        )
    dead_age = 0
    if m.HasField("dead_retention"):
        dead_age = validation.duration_ms(
            p + "dead_retention", m.dead_retention, lo=1000, hi=3660 * DAY_MS
        )
    if m.dead_max_jobs > MAX_DEAD_JOBS:
        raise InvalidArgument(p + "dead_max_jobs", f"must be 0 (no limit) to {MAX_DEAD_JOBS}")
    push = push_in(*queue, m.push, current_push) if m.HasField("push") else None
    return QueueSettings(
        shards=shards,
        lease_ms=lease,
        max_attempts=m.max_attempts,
        retry=retry,
        completed_retention_ms=completed,
        dead_retention_ms=dead_age,
        dead_max_jobs=m.dead_max_jobs,
        push=push,
    )


def settings_out(s: QueueSettings) -> admin_pb2.QueueSettings:
    out = admin_pb2.QueueSettings(
        shards=s.shards, max_attempts=s.max_attempts, dead_max_jobs=s.dead_max_jobs
    )
    if s.lease_ms:
        out.default_lease.CopyFrom(convert.dur(s.lease_ms))
    if s.retry is not None:
        out.retry.initial_backoff.CopyFrom(convert.dur(s.retry.initial_ms))
        out.retry.max_backoff.CopyFrom(convert.dur(s.retry.max_ms))
        out.retry.multiplier = s.retry.multiplier
        out.retry.jitter = s.retry.jitter
    if s.completed_retention_ms is not None:
        out.completed_retention.CopyFrom(convert.dur(s.completed_retention_ms))
    if s.dead_retention_ms:
        out.dead_retention.CopyFrom(convert.dur(s.dead_retention_ms))
    if s.push is not None:
        out.push.CopyFrom(push_out(s.push))
    return out


async def queue_stats(deps: Deps, namespace: str, queue: str, shards: int) -> job_pb2.QueueStats:
    """Counts of every shard summed (as GetQueueStats answers them)."""
    return await summed_stats(deps.store, namespace, queue, shards)


class QueueOps:
    """Queue RPCs as plain coroutines: the gRPC servicer and the HTTP API call them."""

    def __init__(self, deps: Deps) -> None:
        self.d = deps

    async def queue(self, namespace: str, queue: str) -> admin_pb2.Queue:
        """The queue message, settings read fresh from Redis."""
        settings = await self.d.store.queues.fresh(namespace, queue)
        if settings is None:
            await existing_shards(self.d, namespace, queue)  # raises NOT_FOUND
            raise AssertionError("unreachable")
        return admin_pb2.Queue(
            namespace=namespace,
            queue=queue,
            settings=settings_out(settings),
            stats=await queue_stats(self.d, namespace, queue, settings.shards),
            paused=settings.paused,
        )

    async def list_queues(self, req: admin_pb2.ListQueuesRequest) -> admin_pb2.ListQueuesResponse:
        ns = validation.name("namespace", req.namespace) if req.namespace else ""
        size = page_size(req.page_size, default=100, hi=500)
        after = req.page_token
        if after and (after.count("/") != 1 or len(after) > 200):
            raise InvalidArgument("page_token", "not a token from ListQueues; start with ''")
        names = [
            (n, q)
            for n, q in await self.d.store.known_queues()
            if (not ns or n == ns) and readable(n) and f"{n}/{q}" > after
        ]
        resp = admin_pb2.ListQueuesResponse()
        for n, q in names[:size]:
            settings = await self.d.store.queues.fresh(n, q)
            if settings is None:  # deleted meanwhile
                continue
            resp.queues.append(
                admin_pb2.Queue(
                    namespace=n,
                    queue=q,
                    settings=settings_out(settings),
                    stats=await queue_stats(self.d, n, q, settings.shards),
                    paused=settings.paused,
                )
            )
        if len(names) > size:
            n, q = names[size - 1]
            resp.next_page_token = f"{n}/{q}"
        return resp

    async def create_queue(
        self, req: admin_pb2.CreateQueueRequest
    ) -> admin_pb2.CreateQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        shards = req.settings.shards or self.d.cfg.shards_per_queue
        if not 1 <= shards <= 1024:
            raise InvalidArgument("settings.shards", "must be 1 to 1024 (0 = server default)")
        settings = settings_in(self.d, req.settings, shards=shards, queue=(ns, q))
        if await self.d.store.shard_count(ns, q, create=False):
            raise AlreadyExists(f"queue: {ns}/{q} exists; change it with UpdateQueue")
        if self.d.quotas is not None:
            await self.d.quotas.queue(ns, q)
        if not await self.d.store.queues.create(ns, q, settings, self.d.store.bucket_width_ms):
            raise AlreadyExists(f"queue: {ns}/{q} exists; change it with UpdateQueue")
        self.d.timers.ensure(ns, q, await existing_shards(self.d, ns, q))
        return admin_pb2.CreateQueueResponse(queue=await self.queue(ns, q))

    async def get_queue(self, req: admin_pb2.GetQueueRequest) -> admin_pb2.GetQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        await existing_shards(self.d, ns, q)
        return admin_pb2.GetQueueResponse(queue=await self.queue(ns, q))

    async def update_queue(
        self, req: admin_pb2.UpdateQueueRequest
    ) -> admin_pb2.UpdateQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        paths = list(req.update_mask.paths)
        if not paths:
            raise InvalidArgument(
                "update_mask", f"name the settings to change: {', '.join(MASK_FIELDS)}"
            )
        for i, path in enumerate(paths):
            if path == "shards":
                raise InvalidArgument(
                    f"update_mask.paths[{i}]", "shards are fixed when the queue is created"
                )
            if path not in MASK_FIELDS:
                raise InvalidArgument(
                    f"update_mask.paths[{i}]",
                    f"{path[:80]!r} is not one of {', '.join(MASK_FIELDS)}",
                )
        current = await self.d.store.queues.push_target(ns, q) if "push" in paths else None
        new = settings_in(
            self.d, req.settings, shards=0, queue=(ns, q), current_push=current
        ).fields()
        shards = await existing_shards(self.d, ns, q)
        await self.d.store.queues.update(
            ns, q, {MASK_FIELDS[p]: new.get(MASK_FIELDS[p]) for p in paths}
        )
        self.d.timers.ensure(ns, q, shards)
        self.d.timers.sweep_soon(ns, q)  # the janitor applies a new retention now
        return admin_pb2.UpdateQueueResponse(queue=await self.queue(ns, q))

    async def delete_queue(
        self, req: admin_pb2.DeleteQueueRequest
    ) -> admin_pb2.DeleteQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        shards = await existing_shards(self.d, ns, q)
        left = await self.d.store.queues.drop(ns, q, shards)
        if left is not None:
            raise FailedPrecondition(
                f"queue: {ns}/{q} is not empty ({left.scheduled} scheduled, {left.ready} "
                f"ready, {left.leased} leased, {left.dead} dead, {left.completed} completed "
                "in one shard): purge it first (PurgeQueue)"
            )
        await self.d.timers.forget_queue(ns, q)
        return admin_pb2.DeleteQueueResponse()

    async def pause_queue(self, req: admin_pb2.PauseQueueRequest) -> admin_pb2.PauseQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        shards = await existing_shards(self.d, ns, q)
        await self.d.store.queues.set_paused(ns, q, shards, True)
        return admin_pb2.PauseQueueResponse(queue=await self.queue(ns, q))

    async def resume_queue(
        self, req: admin_pb2.ResumeQueueRequest
    ) -> admin_pb2.ResumeQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        shards = await existing_shards(self.d, ns, q)
        await self.d.store.queues.set_paused(ns, q, shards, False)
        return admin_pb2.ResumeQueueResponse(queue=await self.queue(ns, q))

    async def purge_queue(self, req: admin_pb2.PurgeQueueRequest) -> admin_pb2.PurgeQueueResponse:
        ns, q = queue_name(req.namespace, req.queue)
        if req.state != 0 and int(req.state) not in {int(s) for s in JobState}:
            raise InvalidArgument("state", "must be a JobState (UNSPECIFIED = every state)")
        limit = validation.limit("limit", req.limit, default=1000, hi=10_000)
        shards = await existing_shards(self.d, ns, q)
        states = PURGE_ORDER if req.state == 0 else (JobState(req.state),)
        purged = 0
        for s in range(shards):
            keys = ShardKeys(ns, q, s)
            for state in states:
                while purged < limit:
                    n, left = await self.d.jobs.purge(keys, state, min(PURGE_LIMIT, limit - purged))
                    purged += n
                    if n == 0 or left == 0:
                        break
        remaining = 0
        for s in range(shards):
            c = await self.d.store.queues.counts(ShardKeys(ns, q, s))
            by_state = {
                JobState.SCHEDULED: c.scheduled,
                JobState.READY: c.ready,
                JobState.LEASED: c.leased,
                JobState.DEAD: c.dead,
                JobState.COMPLETED: c.completed,
            }
            remaining += sum(by_state[st] for st in states)
        return admin_pb2.PurgeQueueResponse(purged=purged, remaining=remaining)
