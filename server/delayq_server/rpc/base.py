"""What every RPC family of DelayQueueService shares: its parts and the queue lookup."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from delayq_server import ids, validation
from delayq_server.config import Config
from delayq_server.dispatcher import Dispatcher
from delayq_server.errors import NotFound
from delayq_server.quotas import Quotas
from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.telemetry import Telemetry
from delayq_server.timers.manager import Timers

Ctx = grpc.aio.ServicerContext[Any, Any]


class ServicerBase:
    """The servicer's collaborators, and placement of a queue's shards (created on
    first use, timers started) and of a job (its id names its shard)."""

    def __init__(
        self,
        cfg: Config,
        store: Store,
        dispatcher: Dispatcher,
        timers: Timers,
        telemetry: Telemetry | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self._cfg = cfg
        self._quotas = quotas
        self._store = store
        self._dispatcher = dispatcher
        self._timers = timers
        self._tel = telemetry or Telemetry()
        self._rr = 0

    async def _shards(self, namespace: str, queue: str, *, create: bool) -> int:
        if create and self._quotas is not None and not self._store.known(namespace, queue):
            await self._quotas.queue(namespace, queue)
        count = await self._store.shard_count(namespace, queue, create=create)
        if create:
            self._timers.ensure(namespace, queue, count)
        return count

    async def _job(self, namespace: str, queue: str, job_id: str) -> ShardKeys:
        """Validates a (namespace, queue, job id) triple and finds the job's shard."""
        keys = ShardKeys(validation.namespace(namespace), validation.name("queue", queue), 0)
        shard = validation.job_id(job_id)
        shards = await self._shards(keys.namespace, keys.queue, create=False)
        if shard >= shards:  # also an unknown queue (0 shards)
            raise self._not_found(keys, job_id)
        return ShardKeys(keys.namespace, keys.queue, shard)

    @staticmethod
    def _not_found(keys: ShardKeys, job_id: str) -> NotFound:
        return NotFound(f"job {job_id!r} not found in queue {keys.namespace}/{keys.queue}")

    @staticmethod
    async def per_shard(
        tokens: Sequence[ids.LeaseToken],
        op: Callable[[ShardKeys, list[LeaseRef]], Awaitable[Sequence[int]]],
    ) -> list[int]:
        """Runs ``op`` once per shard the tokens name, concurrently; its per-lease
        outcome codes come back in the tokens' order (Ack, Release)."""
        by_shard: dict[ShardKeys, list[int]] = defaultdict(list)
        for i, t in enumerate(tokens):
            by_shard[t.keys].append(i)
        codes = [0] * len(tokens)

        async def run(keys: ShardKeys, idx: list[int]) -> None:
            out = await op(keys, [tokens[i].ref for i in idx])
            for i, code in zip(idx, out, strict=True):
                codes[i] = code

        if len(by_shard) == 1:  # the usual Ack: no task for gather to make
            await run(*next(iter(by_shard.items())))
        else:
            await asyncio.gather(*(run(k, v) for k, v in by_shard.items()))
        return codes
