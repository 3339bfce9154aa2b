"""`delayq-pipeline export`: per-shard lifecycle streams -> Parquet, from each stream's checkpoint.

One Spark partition per shard reads that shard's stream with XRANGE pages,
from just after its last exported id up to the end the stream had when the
partition started. Events go to ``<out>/events`` (appended), then the new
checkpoints to ``<out>/checkpoints`` (appended; the newest per stream wins).
A crash between the two re-exports some events next time: readers drop
duplicates by (stream, id), which report.py does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import redis
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from delayq_server.store.keys import QUEUES_KEY, ShardKeys, queue_meta_key
from delayq_server.store.lifecycle import decode_event

__all__ = ["EVENT_SCHEMA", "export", "read_events", "shards"]

EVENT_SCHEMA = T.StructType(
    [
        T.StructField("namespace", T.StringType()),
        T.StructField("queue", T.StringType()),
        T.StructField("shard", T.IntegerType()),
        T.StructField("id", T.StringType()),  # stream entry id "ms-seq"
        T.StructField("id_ms", T.LongType()),
        T.StructField("id_seq", T.LongType()),
        T.StructField("event", T.StringType()),
        T.StructField("job_id", T.StringType()),
        T.StructField("time_ms", T.LongType()),
        T.StructField("due_ms", T.LongType()),
        T.StructField("created_ms", T.LongType()),
        T.StructField("attempt", T.IntegerType()),
        T.StructField("reason", T.StringType()),
    ]
)
_CHECKPOINT_SCHEMA = (
    "namespace string, queue string, shard int, id_ms long, id_seq long, events long, "
    "trimmed boolean"
)
Entries = list[tuple[str, dict[str, str]]]


class Shard(NamedTuple):
    namespace: str
    queue: str
    shard: int
    after_ms: int  # export entries strictly after (after_ms, after_seq); (0, 0): all
    after_seq: int


# The server's cluster URL schemes (server redis_client.py): the same URL works here.
_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def _client(redis_url: str) -> Any:
    """A redis-py client for a single Redis or, with redis+cluster://, a Redis Cluster.

    Every key one call reads lives in one shard's hash slot, so the cluster client
    routes each call whole. decode_responses=True: redis-py's stubs still say bytes | str.
    """
    scheme, sep, rest = redis_url.partition("://")
    if sep and scheme in _CLUSTER_SCHEMES:
        url = f"{_CLUSTER_SCHEMES[scheme]}://{rest}"
        return redis.RedisCluster.from_url(url, decode_responses=True)
    return redis.Redis.from_url(redis_url, decode_responses=True)


def ping(redis_url: str) -> None:
    """Raises redis-py's error when ``redis_url`` cannot be reached or refuses us."""
    client = _client(redis_url)
    try:
        client.ping()
    finally:
        client.close()


def shards(redis_url: str) -> list[tuple[str, str, int]]:
    """Every (namespace, queue, shard) the servers know of (queues set + per-queue meta)."""
    client = _client(redis_url)
    try:
        out = []
        for name in sorted(client.smembers(QUEUES_KEY)):
            namespace, queue = str(name).split("/", 1)
            count = int(client.hget(queue_meta_key(namespace, queue), "shards") or 1)
            out += [(namespace, queue, s) for s in range(count)]
        return out
    finally:
        client.close()


def _split(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def _read_shard(redis_url: str, page: int, s: Shard) -> Iterator[tuple[Any, ...]]:
    """Yields an "event" row per new entry, then one "checkpoint" row."""
    client = _client(redis_url)
    key = ShardKeys(s.namespace, s.queue, s.shard).events
    last = (s.after_ms, s.after_seq)
    count = 0
    try:
        tail: Entries = client.xrevrange(key, count=1)  # bound this export: the end as of now
        head: Entries = client.xrange(key, count=1)
        if not tail:
            return
        end = tail[0][0]
        # Entries after the checkpoint were trimmed (MAXLEN) before this export.
        trimmed = last != (0, 0) and _split(head[0][0]) > (last[0], last[1] + 1)
        start = f"({last[0]}-{last[1]}" if last != (0, 0) else "-"
        while True:
            entries: Entries = client.xrange(key, min=start, max=end, count=page)
            for entry_id, fields in entries:
                ev = decode_event(fields)
                ms, seq = _split(entry_id)
                yield (
                    "event", s.namespace, s.queue, s.shard, entry_id, ms, seq, ev.kind,
                    ev.job_id, ev.time_ms, ev.due_ms, ev.created_ms, ev.attempt, ev.reason,
                )  # fmt: skip
                last = (ms, seq)
                count += 1
            if len(entries) < page:
                break
            start = f"({entries[-1][0]}"
        # Checkpoints share the row shape: attempt carries the count, reason the trim flag.
        yield (
            "checkpoint", s.namespace, s.queue, s.shard, f"{last[0]}-{last[1]}", last[0],
            last[1], "", "", 0, 0, 0, count, "trimmed" if trimmed else "",
        )  # fmt: skip
    finally:
        client.close()


def _checkpoints(spark: SparkSession, out: str) -> dict[tuple[str, str, int], tuple[int, int]]:
    try:
        df = spark.read.schema(_CHECKPOINT_SCHEMA).parquet(f"{out}/checkpoints")
    except AnalysisException:  # the first export: no checkpoint yet
        return {}
    rows = df.groupBy("namespace", "queue", "shard").agg(
        F.max(F.struct("id_ms", "id_seq")).alias("last")
    )
    return {
        (r["namespace"], r["queue"], r["shard"]): (r["last"]["id_ms"], r["last"]["id_seq"])
        for r in rows.collect()
    }


def export(spark: SparkSession, redis_url: str, out: str, *, page: int = 10_000) -> dict[str, Any]:
    """Appends every shard's new events to ``<out>/events``; returns what it did."""
    done = _checkpoints(spark, out)
    todo = [Shard(ns, q, s, *done.get((ns, q, s), (0, 0))) for ns, q, s in shards(redis_url)]
    if not todo:
        return {"shards": 0, "events": 0, "trimmed_shards": []}

    def read(part: Iterable[Shard]) -> Iterator[tuple[Any, ...]]:
        for shard in part:
            yield from _read_shard(redis_url, page, shard)

    rows = (
        spark.sparkContext.parallelize(todo, len(todo))
        .mapPartitions(read)
        .toDF(T.StructType([T.StructField("kind", T.StringType()), *EVENT_SCHEMA.fields]))
        .cache()
    )
    try:
        events = rows.where(F.col("kind") == "event").select(*EVENT_SCHEMA.fieldNames())
        events.write.mode("append").parquet(f"{out}/events")
        marks = rows.where(F.col("kind") == "checkpoint").select(
            "namespace",
            "queue",
            "shard",
            "id_ms",
            "id_seq",
            F.col("attempt").cast("long").alias("events"),
            (F.col("reason") == "trimmed").alias("trimmed"),
        )
        marks = marks.cache()
        marks.write.mode("append").parquet(f"{out}/checkpoints")
        summary = marks.collect()
    finally:
        rows.unpersist()
    return {
        "shards": len(todo),
        "events": sum(int(r["events"]) for r in summary),
        "trimmed_shards": [
            f"{r['namespace']}/{r['queue']}/{r['shard']}" for r in summary if r["trimmed"]
        ],
    }


def read_events(spark: SparkSession, out: str) -> DataFrame:
    """The exported events, each once (a re-export after a crash may have written twice)."""
    df = spark.read.schema(EVENT_SCHEMA).parquet(f"{out}/events")
    return df.dropDuplicates(["namespace", "queue", "shard", "id"])
