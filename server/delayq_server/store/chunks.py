"""How a batch is cut into bounded script calls (docs/design.md: every script is bounded).

Redis runs one script at a time, so a long call stalls every other client of the
node. A call's Redis time is about 8 µs per job for the job's own writes (record,
bucket entry) plus, for each new due time in the call, a bucket lookup and now and
then a split: 100 jobs with 100 due times spread over 30 days held Redis 2.4-2.6 ms
per call with 0.3-1M jobs in place, against 0.5-0.8 ms for 25 such jobs and 1.4-1.7 ms
for 100 jobs of one due time (`make bench-enqueue-calls`, docs/decisions.md,
"enqueue calls bounded by due times"). So a call takes at most ENQUEUE_CHUNK jobs
and at most ENQUEUE_DUE_TIMES due times, and the script itself stops at
ENQUEUE_BUDGET_US of Redis time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from delayq_server.store.store import JobSpec

T = TypeVar("T")
C = TypeVar("C")

# 500 jobs per call took 7-20 ms of Redis time (issue 11).
ENQUEUE_CHUNK = 100
ENQUEUE_DUE_TIMES = 25
# What the cut above cannot foresee is where due times land: 100 jobs of one delay
# in the middle of existing buckets split them on the batch's first call, which took
# 1.3-2.6 ms against 0.7-1.0 for the calls after it. So enqueue.lua also stops at this
# much of Redis' own time since the call began (µs, checked every 4 jobs; what is left
# after the check, the deferred ZADD and the reply, adds ~0.3 ms) and the caller sends
# the rest in a next call. 1,200 cut 1 call in 10 of one-delay batches beside a 1M
# backlog and brought their slowest call per 40 from 1.93 to 1.52 ms (median of 30
# rounds; p90 2.52 -> 1.74); 1,000 cut the batched producer's calls in a slow hour and
# cost it throughput (docs/decisions.md, 2026-11-26).
ENQUEUE_BUDGET_US = 1_200
# Calls of one batch in flight at once: each holds a pooled Redis connection, and
# each connection costs Redis ~20 kB of buffers. 40 at once (1,000 spread jobs)
# added 7 B per job to `make bench`'s 100,000-job memory figure; 10 is what a
# 1,000-job batch of 100-job calls had.
CHUNKS_AT_ONCE = 10


def fixed_chunks(items: Sequence[T], size: int) -> list[Sequence[T]]:
    """``items`` cut every ``size``."""
    return [items[s : s + size] for s in range(0, len(items), size)]


def enqueue_chunks(jobs: Sequence[JobSpec]) -> list[Sequence[JobSpec]]:
    """Consecutive runs of ``jobs`` with at most ENQUEUE_CHUNK jobs and
    ENQUEUE_DUE_TIMES due times each. A job shares the due time of the job before it
    when both have the same delay (one call has one "now") or the same absolute due
    time: enqueue.lua then puts it in the bucket it remembers (its memo) without a
    lookup. Jobs due at once go to the ready list and count no due time."""
    if len(jobs) <= ENQUEUE_DUE_TIMES:  # one call whatever their due times (most calls)
        return [jobs]
    chunks: list[Sequence[JobSpec]] = []
    start, due_times = 0, 0
    prev: tuple[int | None, int | None] | None = None
    for i, job in enumerate(jobs):
        key = (job.delay_ms, job.due_at_ms)
        new_due = key != prev and not (job.delay_ms is not None and job.delay_ms <= 0)
        if i - start == ENQUEUE_CHUNK or (new_due and due_times == ENQUEUE_DUE_TIMES):
            chunks.append(jobs[start:i])
            start, due_times = i, 0
        due_times += new_due
        prev = key
    chunks.append(jobs[start:])
    return chunks


async def in_chunks(
    chunks: Sequence[C],
    call: Callable[[C], Awaitable[T]],
    *,
    together: bool,
) -> list[T]:
    """One bounded script call per chunk, replies in chunk order. With ``together``
    (the calls' order cannot show) up to CHUNKS_AT_ONCE go out at once: Redis still
    runs them one at a time, each bounded, without a round trip of this process
    between them; otherwise one after another."""
    if together and len(chunks) > 1:
        gate = asyncio.Semaphore(CHUNKS_AT_ONCE)

        async def gated(chunk: C) -> T:
            async with gate:
                return await call(chunk)

        return list(await asyncio.gather(*(gated(c) for c in chunks)))
    return [await call(c) for c in chunks]
