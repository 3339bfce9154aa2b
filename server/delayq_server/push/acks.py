"""Acks of one process's pushes gathered per shard: one ack script call carries many."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from delayq_server.store import LeaseRef, ShardKeys, Store
from delayq_server.store.store import MAX_BATCH


class AckBatcher:
    """While one ack call is on its way to Redis, the next acks wait and then go
    together (one call per shard), so under load a call carries many leases and
    alone one goes at once. Each caller gets its own lease's AckOutcome code."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._pending: dict[ShardKeys, list[tuple[LeaseRef, asyncio.Future[int]]]] = defaultdict(
            list
        )
        self._flusher: asyncio.Task[None] | None = None

    async def ack(self, keys: ShardKeys, ref: LeaseRef) -> int:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending[keys].append((ref, fut))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush(), name="push acks")
        # Shielded: a cancelled delivery must not cancel the others' shared call.
        return await asyncio.shield(fut)

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, defaultdict(list)
                await asyncio.gather(*(self._send(k, items) for k, items in batch.items()))
        finally:
            self._flusher = None

    async def _send(
        self, keys: ShardKeys, items: list[tuple[LeaseRef, asyncio.Future[int]]]
    ) -> None:
        for start in range(0, len(items), MAX_BATCH):
            chunk = items[start : start + MAX_BATCH]
            try:
                codes = await self._store.ack(keys, [ref for ref, _ in chunk])
            except Exception as exc:
                for _, fut in chunk:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), code in zip(chunk, codes, strict=True):
                if not fut.done():
                    fut.set_result(code)
