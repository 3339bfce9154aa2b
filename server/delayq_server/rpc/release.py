"""The Release RPC: consumers give deliveries back unstarted (docs/decisions.md)."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

import grpc

from delayq.v1 import service_pb2
from delayq_server import errors, validation
from delayq_server.rpc.base import ServicerBase
from delayq_server.store import ReleaseOutcome, ShardKeys

_RESULT = {
    ReleaseOutcome.RELEASED: service_pb2.RELEASE_RESULT_RELEASED,
    ReleaseOutcome.STALE: service_pb2.RELEASE_RESULT_STALE,
    ReleaseOutcome.UNKNOWN: service_pb2.RELEASE_RESULT_UNKNOWN,
}


class ReleaseRpcs(ServicerBase):
    """Mixed into DelayQueueService."""

    @errors.unary
    async def Release(
        self, request: service_pb2.ReleaseRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> service_pb2.ReleaseResponse:
        tokens = validation.tokens(list(request.lease_tokens))
        by_shard: dict[ShardKeys, list[int]] = defaultdict(list)
        for i, t in enumerate(tokens):
            by_shard[t.keys].append(i)
        codes = [0] * len(tokens)

        async def run(keys: ShardKeys, idx: list[int]) -> None:
            out = await self._store.give_back(keys, [tokens[i].ref for i in idx])
            for i, code in zip(idx, out, strict=True):
                codes[i] = code

        await asyncio.gather(*(run(k, v) for k, v in by_shard.items()))
        # The stream gets the credit back after a cooldown (a closed one in its
        # grace stops holding the leases at once).
        released = [t for t, c in zip(tokens, codes, strict=True) if c == ReleaseOutcome.RELEASED]
        await self._dispatcher.given_back(released)
        if self._tel.metering:
            for keys, n in Counter(t.keys for t in released).items():
                self._tel.on_released(keys, n)
        return service_pb2.ReleaseResponse(results=[_RESULT[c] for c in codes])
