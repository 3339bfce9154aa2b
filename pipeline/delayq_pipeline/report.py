"""`delayq-pipeline report`: per-queue lifecycle figures over an export: Parquet + HTML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from delayq_pipeline.export import read_events
from delayq_server.store.lifecycle import EVENT_KINDS

__all__ = ["BACKLOG_EVENTS", "Tables", "compute", "report"]

Q = ["namespace", "queue"]
PERCENTILES = (0.5, 0.9, 0.99)
TOP_REASONS = 5
HOUR_MS = 3_600_000
# A job whose latest event is one of these is waiting (scheduled or ready).
BACKLOG_EVENTS = ("enqueued", "nacked", "released", "redriven")


@dataclass(frozen=True)
class Tables:
    """The report's tables; each is small (per queue, per bin), fit to collect."""

    summary: DataFrame  # counts, rates, lateness and enqueue->ack percentiles
    attempts: DataFrame  # outcome (acked/dead), attempts -> jobs
    reasons: DataFrame  # event (dead/expired/nacked), reason -> events, top 5 each
    throughput: DataFrame  # bin start ms, event -> events
    backlog: DataFrame  # due hour start ms -> waiting jobs

    def items(self) -> list[tuple[str, DataFrame]]:
        return [
            ("summary", self.summary),
            ("attempts", self.attempts),
            ("reasons", self.reasons),
            ("throughput", self.throughput),
            ("backlog", self.backlog),
        ]


def _percentiles(df: DataFrame, value: str, name: str) -> DataFrame:
    """Exact percentiles (linear interpolation between ranks) and the max, per queue."""
    points = ", ".join(str(p) for p in PERCENTILES)
    ps = F.expr(f"percentile({value}, array({points}))")
    names = [f"{name}_p{round(p * 100)}_ms" for p in PERCENTILES]
    return (
        df.groupBy(*Q)
        .agg(ps.alias("_ps"), F.max(value).cast("double").alias(f"{name}_max_ms"))
        .select(*Q, *[F.col("_ps")[i].alias(n) for i, n in enumerate(names)], f"{name}_max_ms")
    )


def compute(events: DataFrame, *, bin_ms: int = 60_000) -> Tables:
    """The report's tables over deduplicated events (export.read_events)."""
    counts = events.groupBy(*Q).pivot("event", list(EVENT_KINDS)).count().na.fill(0)
    delivered = events.where(F.col("event") == "delivered").withColumn(
        "late", F.col("time_ms") - F.col("due_ms")
    )
    acked = events.where(F.col("event") == "acked").withColumn(
        "e2a", F.col("time_ms") - F.col("created_ms")
    )
    summary = (
        counts.join(_percentiles(delivered, "late", "lateness"), Q, "left")
        .join(_percentiles(acked, "e2a", "enqueue_to_ack"), Q, "left")
        .withColumn("dead_rate", _rate("dead"))
        .withColumn("expiry_rate", _rate("expired"))
        .orderBy(*Q)
    )
    attempts = (
        events.where(F.col("event").isin("acked", "dead"))
        .groupBy(*Q, F.col("event").alias("outcome"), "attempt")
        .agg(F.count(F.lit(1)).alias("jobs"))
        .orderBy(*Q, "outcome", "attempt")
    )
    by_reason = (
        events.where(F.col("event").isin("dead", "expired", "nacked"))
        .groupBy(*Q, "event", "reason")
        .agg(F.count(F.lit(1)).alias("events"))
    )
    rank = Window.partitionBy(*Q, "event").orderBy(F.desc("events"), "reason")
    reasons = (
        by_reason.withColumn("rank", F.row_number().over(rank))
        .where(F.col("rank") <= TOP_REASONS)
        .orderBy(*Q, "event", "rank")
    )
    throughput = (
        events.where(F.col("event").isin("enqueued", "delivered", "acked"))
        .withColumn("bin_ms", F.floor(F.col("time_ms") / bin_ms) * bin_ms)
        .groupBy(*Q, "bin_ms", "event")
        .agg(F.count(F.lit(1)).alias("events"))
        .orderBy(*Q, "bin_ms", "event")
    )
    # Within one job every event is in its shard's stream, so stream order is its history.
    latest = Window.partitionBy(*Q, "job_id").orderBy(F.desc("id_ms"), F.desc("id_seq"))
    backlog = (
        events.withColumn("n", F.row_number().over(latest))
        .where((F.col("n") == 1) & F.col("event").isin(*BACKLOG_EVENTS))
        .withColumn("due_hour_ms", F.floor(F.col("due_ms") / HOUR_MS) * HOUR_MS)
        .groupBy(*Q, "due_hour_ms")
        .agg(F.count(F.lit(1)).alias("jobs"))
        .orderBy(*Q, "due_hour_ms")
    )
    return Tables(summary, attempts, reasons, throughput, backlog)


def _rate(event: str) -> Column:
    return F.when(F.col("enqueued") > 0, F.col(event) / F.col("enqueued")).otherwise(F.lit(0.0))


def report(spark: SparkSession, events_dir: str, out: str, *, bin_ms: int = 60_000) -> str:
    """Writes ``<out>/<table>/`` Parquet, PNG charts and ``<out>/report.html``; returns its path."""
    from delayq_pipeline import charts  # matplotlib only where a report is drawn

    events = read_events(spark, events_dir).cache()
    try:
        tables = compute(events, bin_ms=bin_ms)
        collected = {}
        for name, df in tables.items():
            df.coalesce(1).write.mode("overwrite").parquet(f"{out}/{name}")
            collected[name] = [r.asDict() for r in df.collect()]
    finally:
        events.unpersist()
    html = charts.render(Path(out), collected, bin_ms=bin_ms)
    return str(html)
