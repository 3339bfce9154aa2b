"""The enqueue-rate allowance a replica takes from the shared token bucket in chunks
(server quotas.py), against the real quota script."""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from delayq_server.quotas import Limits, QuotaExceeded, Quotas
from delayq_server.store.quotas import QuotaStore

# rate 1,000/s, burst 1,000: chunks of min(1,000 / 20, 1,000 * 0.05) = 50 tokens.
LIMITS = Limits(enqueue_rate=1_000, enqueue_burst=1_000)


async def test_calls_that_find_the_allowance_empty_together_share_one_refill(
    aredis: aioredis.Redis,
) -> None:
    # Found by bench/workers_scaling.py: 50 callers at 2.6k jobs/s were refused by a
    # 100,000 jobs/s quota. Each call that found the allowance empty took its own
    # chunk, and each refill overwrote the last, so 200 calls together asked the
    # bucket for 200 chunks (10,200 tokens) and most of them were refused.
    quotas = Quotas(QuotaStore(aredis), LIMITS, "srv")
    out = await asyncio.gather(
        *(quotas.enqueue("ns", 1) for _ in range(200)), return_exceptions=True
    )
    refused = [r for r in out if isinstance(r, QuotaExceeded)]
    assert not refused, f"{len(refused)} of 200 refused within a burst of 1,000"
    tokens = float(await aredis.hget("dq:{ns:ns}:rate", "tokens") or 0)
    assert tokens >= 1_000 - 200 - 50 * 4  # a few chunks at most, not one per call


async def test_the_rate_still_holds_for_concurrent_calls(aredis: aioredis.Redis) -> None:
    quotas = Quotas(QuotaStore(aredis), LIMITS, "srv")
    start = time.monotonic()
    out = await asyncio.gather(
        *(quotas.enqueue("ns", 1) for _ in range(1_500)), return_exceptions=True
    )
    elapsed = time.monotonic() - start
    admitted = sum(1 for r in out if r is None)
    # The burst, plus what refilled meanwhile (at 1,000/s; a chunk of slack), whatever
    # the machine's speed.
    assert 1_000 <= admitted <= 1_000 + 1_000 * elapsed + 50
    assert all(isinstance(r, QuotaExceeded) for r in out if r is not None)


async def test_a_refused_refill_answers_its_waiters_without_more_bucket_calls(
    quiet_redis: aioredis.Redis,
) -> None:
    aredis = quiet_redis  # counts EVALSHA calls: a Redis of its own (conftest.py)
    quotas = Quotas(QuotaStore(aredis), LIMITS, "srv")
    await quotas.enqueue("ns", 1_000)  # the whole burst
    before = (await aredis.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0)
    out = await asyncio.gather(
        *(quotas.enqueue("ns", 5) for _ in range(50)), return_exceptions=True
    )
    after = (await aredis.info("commandstats"))["cmdstat_evalsha"]["calls"]
    refused = [r for r in out if isinstance(r, QuotaExceeded)]
    assert len(refused) >= 45  # at 1,000/s a few ms refill only a few tokens
    assert after - before < 10, "each waiter asked the bucket again"
