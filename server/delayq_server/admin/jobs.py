"""Job operations: list by state, reschedule, update, redrive dead letters (issue 14)."""

from __future__ import annotations

import asyncio
import re
import time

from delayq.v1 import admin_pb2
from delayq_server import convert, ids, validation
from delayq_server.admin.common import Deps, existing_shards, page_size, queue_name
from delayq_server.errors import FailedPrecondition, InvalidArgument, NotFound
from delayq_server.store import JobSpec, ShardKeys, UnknownJob
from delayq_server.store.jobs_admin import LeasedJob, NotWaiting, Page, PastExpiry
from delayq_server.store.records import JobState

MAX_MS = validation.MAX_TIMESTAMP_S * 1000
PREVIEW_DEFAULT, PREVIEW_MAX = 256, 65_536
# Jobs per dead.lua call (and per move into another queue): a redrive rewrites
# each record, so 100 per call keeps one call near 1 ms (bench/admin.py).
REDRIVE_CHUNK = 100
REDRIVEN_FROM = "delayq-redriven-from"
_TOKEN_RE = re.compile(r"^([1-5])\.(\d{1,4})\.(\d{1,15})\.(\d{1,12})$")


def _state(value: int) -> JobState:
    if value not in set(JobState):
        raise InvalidArgument(
            "state", "required: SCHEDULED, READY, LEASED, DEAD or COMPLETED (1 to 5)"
        )
    return JobState(value)


def _page_token(value: str, state: JobState, shards: int) -> tuple[int, int, int]:
    """(shard, bucket, offset) of a ListJobs token made for this state and queue."""
    if not value:
        return 0, 0, 0
    m = _TOKEN_RE.match(value)
    if m is None or int(m.group(1)) != state or int(m.group(2)) >= shards:
        raise InvalidArgument(
            "page_token", "not a token from ListJobs for this queue and state; start with ''"
        )
    return int(m.group(2)), int(m.group(3)), int(m.group(4))


class JobOps:
    """Job RPCs as plain coroutines: the gRPC servicer and the HTTP API call them."""

    def __init__(self, deps: Deps) -> None:
        self.d = deps

    async def _job_keys(self, namespace: str, queue: str, job_id: str) -> ShardKeys:
        ns, q = queue_name(namespace, queue)
        shard = validation.job_id(job_id)
        shards = await existing_shards(self.d, ns, q)
        if shard >= shards:
            raise NotFound(f"job_id: no job {job_id!r} in queue {ns}/{q}")
        return ShardKeys(ns, q, shard)

    async def list_jobs(self, req: admin_pb2.ListJobsRequest) -> admin_pb2.ListJobsResponse:
        ns, q = queue_name(req.namespace, req.queue)
        state = _state(req.state)
        lo = validation.timestamp_ms("from_time", req.from_time) if req.HasField("from_time") else 0
        hi = validation.timestamp_ms("to_time", req.to_time) if req.HasField("to_time") else MAX_MS
        if hi <= lo:
            raise InvalidArgument("to_time", "must be after from_time")
        size = page_size(req.page_size, default=50, hi=500)
        if req.payload_preview_bytes > PREVIEW_MAX:
            raise InvalidArgument("payload_preview_bytes", f"must be 0 to {PREVIEW_MAX}")
        preview = req.payload_preview_bytes or PREVIEW_DEFAULT
        shards = await existing_shards(self.d, ns, q)
        shard, bucket, offset = _page_token(req.page_token, state, shards)
        now = await self.d.store.time_ms()
        resp = admin_pb2.ListJobsResponse()
        while shard < shards and len(resp.jobs) < size:
            keys = ShardKeys(ns, q, shard)
            page = await self._page(keys, state, lo, hi, bucket, offset, size - len(resp.jobs))
            for job_id, rec in await self.d.jobs.records(keys, page.ids):
                if state is JobState.READY and not lo <= rec.due_ms < hi:
                    continue
                job = convert.job(keys, job_id, rec, now)
                job.payload = job.payload[:preview]
                resp.jobs.append(job)
            if page.more:
                bucket, offset = page.bucket, page.offset
            else:
                shard, bucket, offset = shard + 1, 0, 0
        if shard < shards:
            resp.next_page_token = f"{int(state)}.{shard}.{bucket}.{offset}"
        return resp

    async def _page(
        self, keys: ShardKeys, state: JobState, lo: int, hi: int, bucket: int, offset: int, n: int
    ) -> Page:
        j = self.d.jobs
        if state is JobState.SCHEDULED:
            return await j.scheduled_page(keys, lo, hi, bucket, offset, n)
        if state is JobState.READY:
            return await j.ready_page(keys, offset, n)
        key = {JobState.LEASED: keys.leased, JobState.DEAD: keys.dead}.get(state, keys.done)
        return await j.zset_page(key, lo, hi, offset, n)

    async def reschedule_job(
        self, req: admin_pb2.RescheduleJobRequest
    ) -> admin_pb2.RescheduleJobResponse:
        keys = await self._job_keys(req.namespace, req.queue, req.job_id)
        which = req.WhichOneof("schedule")
        delay_ms = due_ms = None
        if which == "delay":
            delay_ms = validation.duration_ms("delay", req.delay, lo=0, hi=validation.MAX_DELAY_MS)
        elif which == "due_time":
            due_ms = validation.timestamp_ms("due_time", req.due_time)
            now = await self.d.store.time_ms()
            if due_ms > now + validation.MAX_DELAY_MS:
                raise InvalidArgument("due_time", "must be at most 366 days after now")
        else:
            raise InvalidArgument("delay", "required: give delay or due_time")
        where = f"job {req.job_id!r} of queue {keys.namespace}/{keys.queue}"
        try:
            out = await self.d.jobs.reschedule(
                keys, req.job_id, delay_ms=delay_ms, due_ms=due_ms, force=req.force
            )
        except UnknownJob:
            raise NotFound(f"job_id: no {where} (acked, deleted, expired or purged)") from None
        except LeasedJob:
            raise FailedPrecondition(
                f"force: {where} is leased to a consumer; set force to take the lease back "
                "(its attempt stays counted)"
            ) from None
        except NotWaiting as exc:
            hint = "redrive it instead" if exc.state is JobState.DEAD else "it is finished"
            raise FailedPrecondition(f"job_id: {where} is {exc.state.name}: {hint}") from None
        except PastExpiry:
            raise FailedPrecondition(
                f"due_time: {where} expires (TTL) before the new due time"
            ) from None
        if out.nonce and self.d.dispatcher is not None:  # the holder's stream gets its credit
            await self.d.dispatcher.credit([ids.LeaseToken(keys, req.job_id, out.nonce)])
        self.d.timers.ensure(
            keys.namespace, keys.queue, await existing_shards(self.d, keys.namespace, keys.queue)
        )
        rec, now = await self.d.store.get(keys, req.job_id)
        return admin_pb2.RescheduleJobResponse(job=convert.job(keys, req.job_id, rec, now))

    async def update_job(self, req: admin_pb2.UpdateJobRequest) -> admin_pb2.UpdateJobResponse:
        keys = await self._job_keys(req.namespace, req.queue, req.job_id)
        paths = set(req.update_mask.paths)
        if not paths or not paths <= {"payload", "headers"}:
            raise InvalidArgument("update_mask", "name 'payload' and/or 'headers'")
        payload = None
        if "payload" in paths:
            if not req.payload:
                raise InvalidArgument("payload", "must not be empty")
            if len(req.payload) > self.d.cfg.max_payload_bytes:
                raise InvalidArgument(
                    "payload", f"over the {self.d.cfg.max_payload_bytes}-byte limit"
                )
            payload = req.payload
        headers = None
        if "headers" in paths:
            if len(req.headers) > validation.MAX_HEADERS:
                raise InvalidArgument("headers", f"at most {validation.MAX_HEADERS} entries")
            for k, v in req.headers.items():
                if not k or len(k.encode()) > validation.MAX_HEADER_KEY:
                    raise InvalidArgument(
                        "headers", f"keys must be 1-{validation.MAX_HEADER_KEY} bytes"
                    )
                if len(v.encode()) > validation.MAX_HEADER_VALUE:
                    raise InvalidArgument(f"headers[{k[:80]!r}]", "value too long")
            headers = dict(req.headers)
        where = f"job {req.job_id!r} of queue {keys.namespace}/{keys.queue}"
        try:
            await self.d.jobs.update(keys, req.job_id, payload=payload, headers=headers)
        except UnknownJob:
            raise NotFound(f"job_id: no {where}") from None
        except NotWaiting as exc:
            raise FailedPrecondition(
                f"job_id: {where} is {exc.state.name}: only waiting jobs can change"
            ) from None
        rec, now = await self.d.store.get(keys, req.job_id)
        return admin_pb2.UpdateJobResponse(job=convert.job(keys, req.job_id, rec, now))

    async def redrive(
        self, req: admin_pb2.RedriveDeadLettersRequest
    ) -> admin_pb2.RedriveDeadLettersResponse:
        ns, q = queue_name(req.namespace, req.queue)
        target = validation.name("target_queue", req.target_queue) if req.target_queue else q
        limit = validation.limit("limit", req.limit, default=1000, hi=10_000)
        if req.rate > 100_000:
            raise InvalidArgument("rate", "must be 0 (no limit) to 100000 jobs per second")
        by_shard: dict[int, list[str]] = {}
        for i, job_id in enumerate(req.job_ids):
            try:
                by_shard.setdefault(validation.job_id(job_id), []).append(job_id)
            except InvalidArgument:
                raise InvalidArgument(f"job_ids[{i}]", "is not a delayq job id") from None
        if len(req.job_ids) > 10_000:
            raise InvalidArgument("job_ids", "at most 10000 per call")
        shards = await existing_shards(self.d, ns, q)
        target_shards = shards
        if target != q:
            target_shards = await existing_shards(self.d, ns, target, "target_queue")
        chunk = min(REDRIVE_CHUNK, req.rate or REDRIVE_CHUNK)
        moved = 0
        started = time.monotonic()
        for s in range(shards):
            keys = ShardKeys(ns, q, s)
            given = by_shard.get(s, [])
            if req.job_ids and not given:
                continue
            pos = 0
            while moved < limit:
                n = min(chunk, limit - moved)
                if req.job_ids:
                    batch, pos = given[pos : pos + n], pos + n
                    if not batch:
                        break
                else:
                    batch = []
                if target == q:
                    done = await self.d.store.dead_action(keys, "redrive", batch, n)
                else:
                    done = await self._move(keys, batch, n, target, target_shards)
                moved += done
                if req.rate:  # pace: never ahead of `rate` jobs per second
                    ahead = moved / req.rate - (time.monotonic() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
                if not req.job_ids and done < n:
                    break
        if target != q:
            self.d.timers.ensure(ns, target, target_shards)
        remaining = 0
        for s in range(shards):
            remaining += (await self.d.store.queues.counts(ShardKeys(ns, q, s))).dead
        return admin_pb2.RedriveDeadLettersResponse(redriven=moved, remaining=remaining)

    async def _move(
        self, keys: ShardKeys, given: list[str], n: int, target: str, target_shards: int
    ) -> int:
        """Dead jobs to another queue: written there (new ids, ready now) before
        they leave the dead set. The two queues' keys live in different slots,
        so this is two scripts: a crash between them leaves a job in both
        places (at least once), never in neither."""
        if given:
            recs = await self.d.jobs.records(keys, given)
        else:
            recs = await self.d.store.dead_page(keys, 0, n)
        recs = [(i, r) for i, r in recs if r.state is JobState.DEAD]
        if not recs:
            return 0
        groups: dict[int, list[JobSpec]] = {}
        for k, (job_id, rec) in enumerate(recs):
            shard = k % target_shards
            groups.setdefault(shard, []).append(
                JobSpec(
                    job_id=ids.new_job_id(shard, target_shards),
                    payload=rec.payload,
                    headers={
                        **rec.headers,
                        REDRIVEN_FROM: f"{keys.namespace}/{keys.queue}/{job_id}",
                    },
                    delay_ms=0,
                    due_at_ms=None,
                    ttl_ms=0,
                    max_attempts=rec.max_attempts,
                    backoff_initial_ms=rec.backoff_initial_ms,
                    backoff_max_ms=rec.backoff_max_ms,
                    multiplier=rec.multiplier,
                    jitter=rec.jitter,
                    idempotency_key="",
                )
            )
        for shard, specs in groups.items():
            await self.d.store.enqueue(ShardKeys(keys.namespace, target, shard), specs)
        return await self.d.store.dead_action(keys, "purge", [i for i, _ in recs], 0)
