"""GetQueueStats and the dead-letter RPCs: one queue over all its shards."""

from __future__ import annotations

from collections import defaultdict

from delayq.v1 import service_pb2
from delayq_server import convert, errors, validation
from delayq_server.errors import InvalidArgument
from delayq_server.queue_stats import summed_stats
from delayq_server.rpc.base import Ctx, ServicerBase
from delayq_server.store import (
    BacklogDue,
    ShardKeys,
)


class QueueRpcs(ServicerBase):
    """Mixed into DelayQueueService."""

    @errors.unary
    async def GetQueueStats(
        self, request: service_pb2.GetQueueStatsRequest, context: Ctx
    ) -> service_pb2.GetQueueStatsResponse:
        ns = validation.namespace(request.namespace)
        queue = validation.name("queue", request.queue)
        shards = await self._shards(ns, queue, create=False)
        stats = await summed_stats(self._store, ns, queue, shards)
        due = BacklogDue()
        for s in range(shards):
            due += await self._store.backlog_due(ShardKeys(ns, queue, s))
        stats.backlog_due.within_minute = due.within_minute
        stats.backlog_due.within_hour = due.within_hour
        stats.backlog_due.within_day = due.within_day
        stats.backlog_due.later = due.later
        return service_pb2.GetQueueStatsResponse(stats=stats)

    @errors.unary
    async def ListDeadJobs(
        self, request: service_pb2.ListDeadJobsRequest, context: Ctx
    ) -> service_pb2.ListDeadJobsResponse:
        ns = validation.namespace(request.namespace)
        queue = validation.name("queue", request.queue)
        size = validation.limit("page_size", request.page_size, default=100, hi=1000)
        shards = await self._shards(ns, queue, create=False)
        shard, offset = validation.dead_page_token(request.page_token, shards)
        now = await self._store.time_ms()
        resp = service_pb2.ListDeadJobsResponse()
        while shard < shards and len(resp.jobs) < size:
            keys = ShardKeys(ns, queue, shard)
            want = size - len(resp.jobs)
            page = await self._store.dead_page(keys, offset, want)
            for job_id, rec in page:
                resp.jobs.append(convert.job(keys, job_id, rec, now))
            if len(page) < want:
                shard, offset = shard + 1, 0
            else:
                offset += len(page)
        if shard < shards:
            resp.next_page_token = f"{shard}:{offset}"
        return resp

    async def _dead_action(
        self, action: str, namespace: str, queue: str, job_ids: list[str], limit: int
    ) -> int:
        ns = validation.namespace(namespace)
        q = validation.name("queue", queue)
        lim = validation.limit("limit", limit, default=1000, hi=100_000)
        shards = await self._shards(ns, q, create=False)
        by_shard: dict[int, list[str]] = defaultdict(list)
        for i, job_id in enumerate(job_ids):
            try:
                by_shard[validation.job_id(job_id)].append(job_id)
            except InvalidArgument:
                raise InvalidArgument(f"job_ids[{i}]", "is not a delayq job id") from None
        total = 0
        for s in range(shards):
            keys = ShardKeys(ns, q, s)
            if job_ids:
                chunk = by_shard.get(s, [])
                for start in range(0, len(chunk), 1000):
                    total += await self._store.dead_action(
                        keys, action, chunk[start : start + 1000], 0
                    )
            else:
                left = lim - total
                while left > 0:
                    n = await self._store.dead_action(keys, action, [], min(left, 1000))
                    total += n
                    left -= n
                    if n == 0:
                        break
        return total

    @errors.unary
    async def RedriveDeadJobs(
        self, request: service_pb2.RedriveDeadJobsRequest, context: Ctx
    ) -> service_pb2.RedriveDeadJobsResponse:
        n = await self._dead_action(
            "redrive", request.namespace, request.queue, list(request.job_ids), request.limit
        )
        return service_pb2.RedriveDeadJobsResponse(redriven=n)

    @errors.unary
    async def PurgeDeadJobs(
        self, request: service_pb2.PurgeDeadJobsRequest, context: Ctx
    ) -> service_pb2.PurgeDeadJobsResponse:
        n = await self._dead_action(
            "purge", request.namespace, request.queue, list(request.job_ids), request.limit
        )
        return service_pb2.PurgeDeadJobsResponse(purged=n)
