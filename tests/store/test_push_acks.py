"""The push ack batcher: concurrent acks share script calls, each gets its own outcome."""

from __future__ import annotations

import asyncio
from typing import Any

from delayq_server.push.acks import AckBatcher
from delayq_server.store import AckOutcome, LeaseRef, Store
from tests.support.seed import Shard


class CountingStore(Store):
    calls = 0

    async def ack(self, *args: Any, **kw: Any) -> list[int]:
        self.calls += 1
        return await super().ack(*args, **kw)


async def test_concurrent_acks_share_calls_and_each_gets_its_code(store: Store) -> None:
    counting = CountingStore(store.redis, bucket_width_ms=1000)
    shard = Shard(counting)
    for _ in range(20):
        await shard.ready()
    leases = await shard.claim(20)
    stale = LeaseRef(leases[0].job_id, leases[0].nonce + "x")
    acks = AckBatcher(counting)
    codes = await asyncio.gather(
        *(acks.ack(shard.keys, ref) for ref in leases), acks.ack(shard.keys, stale)
    )
    assert codes[:-1] == [AckOutcome.ACKED] * 20
    assert codes[-1] != AckOutcome.ACKED
    assert counting.calls == 1  # all asked in one event-loop turn: one script call
    await shard.ready()
    (alone,) = await shard.claim(1)
    assert await acks.ack(shard.keys, alone) == AckOutcome.ACKED  # alone: at once
    assert counting.calls == 2
