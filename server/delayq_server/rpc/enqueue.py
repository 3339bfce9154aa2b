"""Enqueue and EnqueueBatch: validation, shard placement, per-item results."""

from __future__ import annotations

import asyncio
import zlib
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, cast

from delayq.v1 import service_pb2
from delayq_server import convert, errors, ids, validation
from delayq_server.errors import InvalidArgument
from delayq_server.rpc.base import Ctx, ServicerBase
from delayq_server.store import (
    EnqueueResult,
    JobSpec,
    ShardKeys,
)
from delayq_server.store.queues import QueueSettings

_NOTHING: dict[str, Any] = {}  # placeholder; every result is replaced before the reply
_INVALID = InvalidArgument.code.value[0]


def _response_fields(
    r: EnqueueResult, due_memo: dict[int, dict[str, int]] | None = None
) -> dict[str, Any]:
    """An EnqueueResponse as constructor fields. A batch shares one due-time dict
    per due ms through ``due_memo`` (the constructor only reads it)."""
    fields: dict[str, Any] = {"job_id": r.job_id, "duplicate": r.duplicate}
    ms = r.due_ms
    if ms >= 0:  # unknown for a duplicate whose job and record are gone
        if due_memo is None:
            fields["due_time"] = convert.parts(ms)
        else:
            due = due_memo.get(ms)
            if due is None:
                due = due_memo[ms] = convert.parts(ms)
            fields["due_time"] = due
    return fields


def _queue_defaults(inp: validation.EnqueueInput, qs: QueueSettings) -> None:
    """Fills what the request left to defaults from the queue's own settings (issue 14)."""
    spec = inp.spec
    if inp.default_attempts and qs.max_attempts:
        spec.max_attempts = qs.max_attempts
    if inp.default_retry and qs.retry is not None:
        spec.backoff_initial_ms = qs.retry.initial_ms
        spec.backoff_max_ms = qs.retry.max_ms
        spec.multiplier = qs.retry.multiplier
        spec.jitter = qs.retry.jitter


def batch_size(n: int) -> None:
    """The cap of one EnqueueBatch (or one EnqueueStream message)."""
    if not 1 <= n <= validation.MAX_BATCH:
        raise InvalidArgument("requests", f"give 1 to {validation.MAX_BATCH} jobs, got {n}")


def _shard_for(key: str, shards: int) -> int:
    """Idempotency keys pick a stable shard so duplicates meet in one script."""
    if shards <= 1:
        return 0
    return zlib.crc32(key.encode()) % shards


class EnqueueRpcs(ServicerBase):
    """Mixed into DelayQueueService."""

    async def _queue_for_enqueue(
        self, namespace: str, queue: str
    ) -> tuple[int | Exception, QueueSettings | None]:
        """A queue's shard count (created on first use) and its settings when they
        fill request defaults; an exception here answers that queue's items only."""
        try:
            shards = await self._shards(namespace, queue, create=True)
            # Cached per replica after the first call (store/queues.py).
            qs = await self._store.queues.settings(namespace, queue)
        except Exception as exc:
            return exc, None
        fills = qs is not None and (qs.max_attempts or qs.retry is not None)
        return shards, qs if fills else None

    async def _clock_refusals(
        self, inputs: list[validation.EnqueueInput], batch_indexes: list[int] | None = None
    ) -> list[InvalidArgument | None]:
        """An absolute due time is bounded by the Redis clock (366-day horizon, TTL);
        the clock is read once for the whole call and only when some job needs it."""
        if not any(i.spec.due_at_ms is not None for i in inputs):
            return [None] * len(inputs)
        now = await self._store.time_ms()
        out = [validation.due_vs_now(inp.spec, now) for inp in inputs]
        if batch_indexes is not None:  # name the item; only refusals pay for the text
            for k, refused in enumerate(out):
                if refused is not None:
                    prefix = f"requests[{batch_indexes[k]}]."
                    out[k] = validation.due_vs_now(inputs[k].spec, now, prefix)
        return out

    async def _store_jobs(
        self, inputs: list[validation.EnqueueInput], context: Ctx, *, trace: bool = True
    ) -> list[EnqueueResult | Exception]:
        """Stores validated jobs with one script call per shard, in input order.

        Each item gets its response or the exception that stopped it: a queue
        that cannot be looked up or a shard whose script fails answers for its
        own items only, so a batch caller always knows which jobs were stored.
        """
        # The caller's trace continues in the consumer through the job's headers.
        trace_headers = self._tel.trace_headers(context) if trace else None
        out: list[EnqueueResult | Exception | None] = [None] * len(inputs)
        # Grouped by plain tuples: a ShardKeys per job was 5% of a batch (issue 12 profile).
        groups: dict[tuple[str, str, int], list[tuple[int, JobSpec]]] = defaultdict(list)
        # Per queue: its shard count (or the exception that answers its items) and its
        # settings when they fill defaults the request left open (issue 14), else None.
        queues: dict[tuple[str, str], tuple[int | Exception, QueueSettings | None]] = {}
        id_texts = ids.new_job_ids(len(inputs))  # made a call at a time: one clock read
        for index, inp in enumerate(inputs):
            ns, queue = inp.namespace, inp.queue
            found = queues.get((ns, queue))
            if found is None:
                found = queues[ns, queue] = await self._queue_for_enqueue(ns, queue)
            shards, fills = found
            if isinstance(shards, Exception):
                out[index] = shards
                continue
            spec = inp.spec
            if fills is not None:
                _queue_defaults(inp, fills)
            if spec.idempotency_key:  # duplicates must meet in one script
                shard = _shard_for(spec.idempotency_key, shards)
            else:
                self._rr += 1
                shard = self._rr % shards
            spec.job_id = (
                id_texts[index] if shards <= 1 else ids.with_shard(id_texts[index], shard, shards)
            )
            if trace_headers:  # a producer's own traceparent header wins
                spec.headers = {**trace_headers, **spec.headers}
            groups[ns, queue, shard].append((index, spec))

        async def run(group: tuple[str, str, int], items: list[tuple[int, JobSpec]]) -> None:
            keys = ShardKeys(*group)
            try:
                results, _ = await self._store.enqueue(keys, [s for _, s in items])
            except Exception as exc:
                for index, _ in items:
                    out[index] = exc
                return
            for (index, _), r in zip(items, results, strict=True):
                out[index] = r
            if self._tel.metering:
                self._tel.on_enqueued(keys, sum(1 for r in results if not r.duplicate))
            ttls = [s.ttl_ms for _, s in items if s.ttl_ms]
            if ttls:
                self._timers.expect_expiry(keys, min(ttls))

        if len(groups) == 1:  # a unary call: no task for gather to make
            await run(*next(iter(groups.items())))
        else:
            await asyncio.gather(*(run(k, v) for k, v in groups.items()))
        return [r for r in out if r is not None]

    @errors.unary
    async def Enqueue(
        self, request: service_pb2.EnqueueRequest, context: Ctx
    ) -> service_pb2.EnqueueResponse:
        inp = validation.enqueue(request, self._cfg)
        (refused,) = await self._clock_refusals([inp])
        if refused is not None:
            raise refused
        if self._quotas is not None:
            await self._quotas.enqueue(inp.namespace, 1)
        (r,) = await self._store_jobs([inp], context)
        if isinstance(r, Exception):
            raise r
        return service_pb2.EnqueueResponse(**_response_fields(r))

    @errors.unary
    async def EnqueueBatch(
        self, request: service_pb2.EnqueueBatchRequest, context: Ctx
    ) -> service_pb2.EnqueueBatchResponse:
        batch_size(len(request.requests))
        results = await self._batch_results(request.requests, context, trace=True)
        return service_pb2.EnqueueBatchResponse(results=cast(Any, results))  # dicts: see below

    async def _batch_results(
        self, requests: Sequence[service_pb2.EnqueueRequest], context: Ctx, *, trace: bool
    ) -> list[dict[str, Any]]:
        """One EnqueueBatchResult per request, as constructor dicts: results are built as
        dicts and turned into messages in one constructor call, 3x cheaper than filling
        1,000 messages field by field (issue 12). ``trace``: store the call's trace
        context in the jobs (not for a long-lived EnqueueStream, whose context is the
        stream's, not any one batch's)."""
        n = len(requests)
        results: list[dict[str, Any]] = [_NOTHING] * n
        valid: list[tuple[int, validation.EnqueueInput]] = []
        cfg = self._cfg
        for i, req in enumerate(requests):
            try:
                valid.append((i, validation.enqueue(req, cfg)))
            except InvalidArgument as exc:  # one bad item never fails the batch
                # The message starts with the field; naming the item costs only refusals.
                results[i] = {
                    "error": {"code": _INVALID, "message": f"requests[{i}].{exc.message}"}
                }
            except Exception as exc:
                code, message = errors.to_status(exc)
                results[i] = {"error": {"code": code.value[0], "message": message}}
        refusals = await self._clock_refusals([inp for _, inp in valid], [i for i, _ in valid])
        if any(r is not None for r in refusals):
            for (i, _), refused in zip(valid, refusals, strict=True):
                if refused is not None:
                    results[i] = {
                        "error": {"code": refused.code.value[0], "message": refused.message}
                    }
            valid = [v for v, refused in zip(valid, refusals, strict=True) if refused is None]
        if valid and self._quotas is not None:
            valid = await self._batch_quota(valid, results)
        if valid:
            stored = await self._store_jobs([inp for _, inp in valid], context, trace=trace)
            statuses: dict[int, dict[str, Any]] = {}  # one log line per failure
            due_memo: dict[int, dict[str, int]] = {}
            for (i, _), r in zip(valid, stored, strict=True):
                if isinstance(r, Exception):
                    if id(r) not in statuses:
                        code, message = errors.to_status(r)
                        statuses[id(r)] = {"error": {"code": code.value[0], "message": message}}
                    results[i] = statuses[id(r)]
                else:
                    results[i] = {"response": _response_fields(r, due_memo)}
        return results

    async def _batch_quota(
        self,
        valid: list[tuple[int, validation.EnqueueInput]],
        results: list[dict[str, Any]],
    ) -> list[tuple[int, validation.EnqueueInput]]:
        """Each namespace's jobs of a batch pass its quotas together or are refused per item."""
        assert self._quotas is not None
        refused = await self._quotas.enqueue_many([inp.namespace for _, inp in valid])
        if not refused:
            return valid
        for i, inp in valid:
            refusal = refused.get(inp.namespace)
            if refusal is not None:
                results[i] = {"error": {"code": refusal.code.value[0], "message": refusal.message}}
        return [(i, inp) for i, inp in valid if inp.namespace not in refused]
