"""Store layer: the only code that talks to Redis."""

from delayq_server.store.backlog import BacklogDue
from delayq_server.store.keys import ShardKeys
from delayq_server.store.records import JobRecord, JobState
from delayq_server.store.store import (
    AckOutcome,
    Claimed,
    EnqueueResult,
    JobSpec,
    LeaseRef,
    NackOutcome,
    ReleaseOutcome,
    ShardStats,
    StaleLease,
    Store,
    UnknownJob,
)

__all__ = [
    "AckOutcome",
    "BacklogDue",
    "Claimed",
    "EnqueueResult",
    "JobRecord",
    "JobSpec",
    "JobState",
    "LeaseRef",
    "NackOutcome",
    "ReleaseOutcome",
    "ShardKeys",
    "ShardStats",
    "StaleLease",
    "Store",
    "UnknownJob",
]
