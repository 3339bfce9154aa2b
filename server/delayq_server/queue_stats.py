"""A queue's counts summed over its shards: GetQueueStats and the admin listing share it."""

from __future__ import annotations

from delayq.v1 import job_pb2
from delayq_server import convert
from delayq_server.store import ShardKeys, Store


async def summed_stats(store: Store, namespace: str, queue: str, shards: int) -> job_pb2.QueueStats:
    """Counts and counters of every shard summed; the oldest ready job's age and the
    next due time over all shards."""
    stats = job_pb2.QueueStats(namespace=namespace, queue=queue, shards=shards)
    oldest: int | None = None
    next_due: int | None = None
    now = 0
    for s in range(shards):
        st = await store.shard_stats(ShardKeys(namespace, queue, s))
        now = st.now_ms
        stats.scheduled += st.scheduled
        stats.ready += st.ready
        stats.leased += st.leased
        stats.dead += st.dead
        stats.completed += st.completed
        stats.enqueued_total += st.counters.get("enqueued", 0)
        stats.acked_total += st.counters.get("acked", 0)
        stats.retried_total += st.counters.get("retried", 0)
        stats.dead_lettered_total += st.counters.get("dead_lettered", 0)
        stats.expired_total += st.counters.get("expired", 0)
        if st.oldest_ready_due_ms is not None:
            oldest = min(oldest or st.oldest_ready_due_ms, st.oldest_ready_due_ms)
        if st.next_due_ms is not None:
            next_due = min(next_due or st.next_due_ms, st.next_due_ms)
    if oldest is not None:
        stats.oldest_ready_age.CopyFrom(convert.dur(max(0, now - oldest)))
    if next_due is not None:
        stats.next_due_time.CopyFrom(convert.ts(next_due))
    return stats
