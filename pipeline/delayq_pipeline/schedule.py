"""Bulk scheduling: a dataset's rows become delayq jobs, sent from the executors."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from delayq_pipeline.prepare import ITEM_COLUMNS, ColumnMapping, prepare, read_dataset, row_json
from delayq_pipeline.sender import OUT_FIELDS, ClientSettings, Item, send_partition

__all__ = ["REJECT_SCHEMA", "Summary", "schedule"]

_OUT_SCHEMA = T.StructType(
    [
        T.StructField(name, T.LongType() if name in _longs else T.StringType())
        for _longs in [{"rows", "enqueued", "duplicates", "retries"}]
        for name in OUT_FIELDS
    ]
)

_ARROW_TYPES = {
    f.name: pa.int64() if f.dataType == T.LongType() else pa.string() for f in _OUT_SCHEMA
}

REJECT_SCHEMA = "key string, queue string, stage string, reason string, row string"


@dataclass(frozen=True)
class Summary:
    """What one run did. A rerun counts the rows it finds already stored as duplicates."""

    rows_read: int
    enqueued: int
    duplicates: int
    rejected: int
    retries: int
    partitions: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows_per_second": round(self.rows_per_second, 1)}


ItemsHook = Callable[[Iterator[Item]], Iterator[Item]]


def _items(batches: Iterable[pa.RecordBatch]) -> Iterator[Item]:
    """Rows of Arrow batches (columns in ITEM_COLUMNS order) as Items."""
    for batch in batches:
        queue, payload, due, delay, key, headers, reject, row = (
            batch.column(i).to_pylist() for i in range(len(ITEM_COLUMNS))
        )
        for i in range(batch.num_rows):
            h = headers[i]
            yield Item(
                queue[i], payload[i], due[i], delay[i], key[i],
                dict(h) if h is not None else None,  # Arrow maps come as (key, value) pairs
                reject[i], row[i],
            )  # fmt: skip


def _partition_fn(settings: ClientSettings, hook: ItemsHook | None) -> Any:
    def run(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        items = _items(batches)
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        records = list(send_partition(hook(items) if hook else items, settings, partition))
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(column, _ARROW_TYPES[name])
                for name, column in zip(OUT_FIELDS, zip(*records, strict=True), strict=True)
            ],
            names=list(OUT_FIELDS),
        )

    return run


def schedule(
    spark: SparkSession,
    inputs: Sequence[str],
    mapping: ColumnMapping,
    client: ClientSettings,
    *,
    fmt: str | None = None,
    rejects_path: str | None = None,
    partitions: int | None = None,
    items_hook: ItemsHook | None = None,
) -> tuple[Summary, DataFrame]:
    """Reads `inputs`, sends every valid row, writes rejects; returns the summary and rejects.

    Each row's idempotency key (its key column, or a hash of the row) makes a
    retried task, a speculative copy or a whole rerun store nothing twice
    within the server's idempotency window (24 h by default). `items_hook`
    wraps each partition's rows on the executor (tests inject task failures).
    """
    started = time.monotonic()
    source = read_dataset(spark, inputs, fmt)
    prepared = prepare(source, mapping).select(*ITEM_COLUMNS)
    if partitions:
        prepared = prepared.repartition(partitions)
    # Arrow moves the rows to Python column-wise: half the Spark-side cost per row of
    # pickled Row objects (docs/decisions.md, issue 10).
    out = (
        prepared.mapInArrow(_partition_fn(client, items_hook), _OUT_SCHEMA)
        # Sent once: the summary and the rejects both read this, never re-run the sends.
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        stats = (
            out.where(F.col("kind") == "stats")
            .agg(
                F.count(F.lit(1)).alias("partitions"),
                F.sum("rows").alias("rows"),
                F.sum("enqueued").alias("enqueued"),
                F.sum("duplicates").alias("duplicates"),
                F.sum("retries").alias("retries"),
            )
            .first()
        )
        rejects = _rejects(source, mapping, out.where(F.col("kind") == "reject"))
        rejects = rejects.persist(StorageLevel.MEMORY_AND_DISK)
        rejected = rejects.count()
        if rejects_path:
            rejects.write.mode("overwrite").parquet(rejects_path)
    finally:
        out.unpersist()
    assert stats is not None
    summary = Summary(
        rows_read=int(stats["rows"] or 0),
        enqueued=int(stats["enqueued"] or 0),
        duplicates=int(stats["duplicates"] or 0),
        rejected=rejected,
        retries=int(stats["retries"] or 0),
        partitions=int(stats["partitions"] or 0),
        seconds=time.monotonic() - started,
    )
    return summary, rejects


def _rejects(source: DataFrame, mapping: ColumnMapping, rejected: DataFrame) -> DataFrame:
    """Rejected rows with their reason; server refusals get their input row back by key."""
    local = rejected.where(F.col("stage") == "input").select(
        "key", "queue", "stage", "reason", "row"
    )
    server = rejected.where(F.col("stage") == "server").select("key", "queue", "stage", "reason")
    if server.isEmpty():  # the usual case: no second read of the input
        return local
    key = (
        F.col(mapping.key_col).cast("string") if mapping.key_col else F.sha2(row_json(source), 256)
    )
    rows = source.select(key.alias("key"), row_json(source).alias("row")).dropDuplicates(["key"])
    joined = rows.join(F.broadcast(server), "key")
    return local.unionByName(joined.select("key", "queue", "stage", "reason", "row"))
