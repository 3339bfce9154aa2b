"""Every Redis key delayq uses, built in one place.

All keys of one shard share the hash tag ``{ns/queue/shard}`` so every Lua
script touches a single slot and runs unchanged on Redis Cluster. Names are
validated (see ``delayq_server.validation``) so no user string can contain
``{``, ``}`` or ``:`` and change routing.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUES_KEY = "dq:queues"  # SET of "ns/queue" known to any replica
PUSH_QUEUES_KEY = "dq:push_queues"  # SET of "ns/queue" whose settings hold a push target
# Bumped at each change of a queue's push target: pushers poll it, since queue events
# reach only the replicas that know the queue (shard 0's channel).
PUSH_VERSION_KEY = "dq:push_version"
REPLICAS_KEY = "dq:replicas"  # ZSET server id -> last heartbeat ms (timer ownership)


def queue_meta_key(namespace: str, queue: str) -> str:
    """HASH: per-queue settings: ``shards`` and ``bucket_width`` fixed at creation,
    the rest (store/queues.py) changeable by UpdateQueue."""
    return f"dq:{{{namespace}/{queue}}}:meta"


def queue_event_prefix(namespace: str, queue: str) -> str:
    """Prefix of a queue's own pub/sub events ("<prefix> queue changed|deleted"):
    every replica drops its cached settings (store/queues.py)."""
    return f"dq:{{{namespace}/{queue}}}:"


# API tokens (issue 9). One hash tag so creation is one MULTI, on a cluster too.
TOKENS_KEY = "dq:{auth}:tokens"  # ZSET: token id -> creation ms
AUTH_BOOTSTRAP_KEY = "dq:{auth}:bootstrap"  # STRING: set once the first admin token exists


def token_key(token_id: str) -> str:
    """HASH: one API token (sha256 of the secret, namespace, roles, times); never the secret."""
    return f"dq:{{auth}}:tok:{token_id}"


# Per-namespace quota state (issue 9). The tag "{ns:<name>}" cannot meet a
# shard tag ("{ns/queue/shard}") or "{auth}": names never contain ":" or "/".
def namespace_queues_key(namespace: str) -> str:
    """SET: queue names of a namespace (counted by the queue quota)."""
    return f"dq:{{ns:{namespace}}}:queues"


def enqueue_rate_key(namespace: str) -> str:
    """HASH: the namespace's enqueue token bucket (tokens, ts)."""
    return f"dq:{{ns:{namespace}}}:rate"


def consume_streams_key(namespace: str) -> str:
    """ZSET: open Consume streams of a namespace -> slot expiry ms."""
    return f"dq:{{ns:{namespace}}}:streams"


def server_channel(server_id: str) -> str:
    """SHARD CHANNEL of one server replica: credit returned to its streams. Its own
    hash tag ("{srv:<id>}" cannot meet a shard's, names never contain ":")."""
    return f"dq:{{srv:{server_id}}}:ch"


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """Keys of one shard of one queue."""

    namespace: str
    queue: str
    shard: int

    @property
    def tag(self) -> str:
        return f"{self.namespace}/{self.queue}/{self.shard}"

    @property
    def prefix(self) -> str:
        """Prefix of every key of the shard; scripts derive record and bucket keys from it."""
        return f"dq:{{{self.tag}}}:"

    @property
    def channel(self) -> str:
        """SHARD CHANNEL (SPUBLISH/SSUBSCRIBE): the shard's wake-ups, "<prefix> ready <n>",
        "<prefix> due <ms>", "<prefix> lease <ms>". Under the shard's hash tag, so on a
        cluster only the node that owns the shard carries them (docs/decisions.md)."""
        return self.prefix + "ch"

    @property
    def index(self) -> str:
        """ZSET: backlog bucket start ms (member, as text) -> the same (score).

        Layout v2 (lua/includes/record.lua): a bucket holds the jobs due from its
        start up to the next bucket's start, and splits past 100 jobs.
        """
        return self.prefix + "bl"

    def bucket(self, start: int | str) -> str:
        """ZSET: job id -> due ms, for jobs due from ``start`` to the next bucket's start."""
        return f"{self.prefix}bt:{start}"

    @property
    def v1_index(self) -> str:
        """ZSET of layout v1 (bucket number -> earliest due); only checked for (store.layout)."""
        return self.prefix + "bi"

    @property
    def ready(self) -> str:
        """LIST: job ids due now; LPUSH in, RPOP out."""
        return self.prefix + "ready"

    @property
    def leased(self) -> str:
        """ZSET: job id -> lease deadline ms."""
        return self.prefix + "leased"

    @property
    def dead(self) -> str:
        """ZSET: job id -> time of death ms."""
        return self.prefix + "dead"

    @property
    def done(self) -> str:
        """ZSET: job id -> completion ms (only with a completed-retention window)."""
        return self.prefix + "done"

    @property
    def expiring(self) -> str:
        """ZSET: job id -> expire ms (jobs with a TTL)."""
        return self.prefix + "exp"

    @property
    def stats(self) -> str:
        """HASH: counters (enqueued, acked, retried, dead_lettered, expired, backlog)."""
        return self.prefix + "stats"

    @property
    def paused(self) -> str:
        """STRING: present while deliveries of the queue are paused (PauseQueue, issue 14)."""
        return self.prefix + "paused"

    @property
    def owner(self) -> str:
        """STRING: server id of the replica running this shard's timers (PX lease)."""
        return self.prefix + "owner"

    @property
    def events(self) -> str:
        """STREAM: lifecycle events of the shard, MAXLEN-bounded (store/lifecycle.py)."""
        return self.prefix + "ev"

    def record_group(self, job_id: str) -> str:
        """HASH: job id -> packed record (records.py) for the ids sharing two
        characters of their random part: 1,024 groups per shard (record.lua). New
        ids set the first of the two from their creation time (ids.py), so jobs
        enqueued together share a few groups."""
        return f"{self.prefix}r:{job_id[10:12]}"

    def idempotency(self, key: str) -> str:
        """STRING: idempotency key -> job id, expiring with the window."""
        return f"{self.prefix}idem:{key}"
