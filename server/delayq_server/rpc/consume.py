"""Consume: a stream of deliveries from the dispatcher, framed by bytes."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, cast

from delayq.v1 import service_pb2
from delayq_server import convert, errors, framing, ids, lateness, logs, validation
from delayq_server.rpc.base import Ctx, ServicerBase
from delayq_server.store import (
    ShardKeys,
)

log = logging.getLogger(__name__)


class ConsumeRpcs(ServicerBase):
    """Mixed into DelayQueueService."""

    @errors.streaming
    async def Consume(self, request: service_pb2.ConsumeRequest, context: Ctx) -> Any:
        inp = validation.consume(request, self._cfg)
        peer = context.peer()
        if self._quotas is None:
            async for item in self._consume(inp, peer):
                yield item
            return
        async with self._quotas.stream(inp.namespace):
            async for item in self._consume(inp, peer):
                yield item

    async def _consume(self, inp: validation.ConsumeInput, peer: str) -> Any:
        shards_by_queue = []
        leases = []
        for q in inp.queues:
            count = await self._shards(inp.namespace, q, create=True)
            shards_by_queue.append([ShardKeys(inp.namespace, q, s) for s in range(count)])
            qs = await self._store.queues.settings(inp.namespace, q)
            if qs is not None and qs.lease_ms:
                leases.append(qs.lease_ms)
        if inp.default_lease and leases:
            # No lease asked: the longest default of the stream's queues (issue 14),
            # so no queue's jobs get a shorter lease than its settings say.
            lease = max(leases)
            inp = dataclasses.replace(
                inp, lease_ms=lease, release_grace_ms=min(inp.release_grace_ms, lease)
            )
        stream = self._dispatcher.open(
            shards_by_queue, inp.max_outstanding, inp.lease_ms, inp.max_batch, inp.release_grace_ms
        )
        cap = self._cfg.max_response_bytes
        opened = time.monotonic()
        delivered = 0
        logs.event(
            log, "stream_opened", "consume stream opened", peer=peer, namespace=inp.namespace,
            queues=",".join(inp.queues), stream=stream.seq, max_outstanding=inp.max_outstanding,
        )  # fmt: skip
        try:
            async for batch in stream.deliveries():
                claimed_at = time.monotonic()
                deliveries = [
                    convert.delivery_fields(
                        keys,
                        c.job_id,
                        c.record,
                        ids.format_token(keys, c.job_id, c.nonce),
                        c.lease_deadline_ms,
                    )
                    for keys, c in batch
                ]
                now = time.monotonic()
                waited_ms = (now - claimed_at) * 1000
                for keys, c in batch:  # the dashboard's lateness p99 (lateness.py)
                    lateness.WINDOW.record(
                        keys.namespace,
                        keys.queue,
                        max(0.0, c.record.last_delivery_ms - c.record.due_ms + waited_ms),
                        now,
                    )
                if self._tel.enabled:
                    self._tel.on_delivered(batch, waited_ms / 1000)
                delivered += len(batch)
                # A default client refuses messages over 4 MiB: cap each by bytes.
                sizes = [framing.bound(c.record) for _, c in batch]
                for start, end in framing.split(sizes, cap):
                    stream.mark_sent(c.nonce for _, c in batch[start:end])
                    # Delivery dicts: see convert.delivery_fields.
                    yield service_pb2.ConsumeResponse(deliveries=cast(Any, deliveries[start:end]))
        finally:
            self._dispatcher.close(stream)
            logs.event(
                log, "stream_closed", "consume stream closed", peer=peer,
                namespace=inp.namespace, queues=",".join(inp.queues), stream=stream.seq,
                delivered=delivered, unanswered=len(stream.outstanding),
                open_s=round(time.monotonic() - opened, 3),
            )  # fmt: skip
