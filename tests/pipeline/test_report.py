"""Export and report over a scripted history (real scripts with an explicit clock, real Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis
from pyspark.sql import SparkSession

from delayq_pipeline.export import export, read_events
from delayq_pipeline.report import compute, report
from delayq_server.store import JobSpec, LeaseRef, ShardKeys, Store
from tests.support.seed import spec

T0 = 1_800_000_000_000  # an hour boundary (T0 / 3_600_000 = 500_000)
HOUR = 3_600_000


class History:
    """Drives one shard through the real scripts at chosen times."""

    def __init__(self, store: Store, keys: ShardKeys) -> None:
        self.store, self.keys = store, keys

    async def enqueue(self, at: int, job: JobSpec) -> str:
        (r,), _ = await self.store.enqueue(self.keys, [job], at)
        return r.job_id

    async def claim_one(self, at: int) -> LeaseRef:
        (c,) = await self.store.claim(self.keys, 1, 30_000, f"t.{at}.", at)
        return LeaseRef(c.job_id, c.nonce)

    async def ack(self, at: int, lease: LeaseRef) -> None:
        await self.store.ack(self.keys, [lease], at)

    async def nack(self, at: int, lease: LeaseRef, reason: str) -> None:
        await self.store.nack(
            self.keys, lease, delay_ms=None, dead_letter=False, reason=reason, now_ms=at
        )


async def script_history(aredis: aioredis.Redis) -> History:
    store = Store(aredis, bucket_width_ms=1000, events_maxlen=10_000)
    keys = ShardKeys("default", "mail", 0)
    await store.shard_count("default", "mail", create=True)  # the export finds queues here
    h = History(store, keys)
    a = await h.enqueue(T0, spec(due_at_ms=T0 + 1000, max_attempts=3, backoff_ms=1000))
    b = await h.enqueue(T0, spec(due_at_ms=T0 + 1001, max_attempts=3, backoff_ms=1000))
    c = await h.enqueue(T0, spec(due_at_ms=T0 + 1002, max_attempts=1))
    await h.enqueue(T0, spec(delay_ms=10_000, ttl_ms=3_000))  # D: expires at T0+3000
    await h.enqueue(T0, spec(delay_ms=2 * HOUR))  # E, F, G: the backlog
    await h.enqueue(T0, spec(delay_ms=2 * HOUR + 100_000))
    await h.enqueue(T0, spec(delay_ms=3 * HOUR + 200_000))
    await store.promote(keys, now_ms=T0 + 1002)
    la = await h.claim_one(T0 + 1010)  # A late 10
    lb = await h.claim_one(T0 + 1031)  # B late 30
    lc = await h.claim_one(T0 + 1072)  # C late 70
    assert [la.job_id, lb.job_id, lc.job_id] == [a, b, c]
    await h.nack(T0 + 1100, lb, "boom")  # B retries at T0+2100 (backoff 1000)
    await h.nack(T0 + 1200, lc, "bad input")  # C: its only attempt -> dead
    await h.ack(T0 + 1500, la)  # A: enqueue -> ack 1500
    await store.promote(keys, now_ms=T0 + 2100)
    lb2 = await h.claim_one(T0 + 2150)  # B late 50
    await h.ack(T0 + 2200, lb2)  # B: enqueue -> ack 2200, 2 attempts
    await store.expire(keys, now_ms=T0 + 3000)  # D expires
    return h


def check_report_files(html: Path) -> None:
    assert "delayq lifecycle report" in html.read_text()
    for chart in ("throughput", "lateness", "attempts", "backlog"):
        assert (html.parent / f"{chart}.png").stat().st_size > 1000


async def test_report_matches_the_hand_computed_figures(
    spark: SparkSession, aredis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    await script_history(aredis)
    out = str(tmp_path / "events")

    assert export(spark, redis_url, out)["events"] == 7 + 4 + 2 + 1 + 1 + 1
    tables = compute(read_events(spark, out), bin_ms=1000)

    (s,) = [r.asDict() for r in tables.summary.collect()]
    assert (s["queue"], s["enqueued"], s["delivered"], s["acked"]) == ("mail", 7, 4, 2)
    assert (s["nacked"], s["dead"], s["expired"], s["deleted"]) == (1, 1, 1, 0)
    # Lateness 10, 30, 50, 70: exact percentiles interpolate between ranks.
    assert (s["lateness_p50_ms"], s["lateness_p90_ms"], s["lateness_max_ms"]) == (40, 64, 70)
    assert s["lateness_p99_ms"] == pytest.approx(69.4)
    # Enqueue -> ack 1500 and 2200.
    assert (s["enqueue_to_ack_p50_ms"], s["enqueue_to_ack_p90_ms"]) == (1850, 2130)
    assert s["enqueue_to_ack_max_ms"] == 2200
    assert (s["dead_rate"], s["expiry_rate"]) == (pytest.approx(1 / 7), pytest.approx(1 / 7))

    attempts = {(r["outcome"], r["attempt"]): r["jobs"] for r in tables.attempts.collect()}
    assert attempts == {("acked", 1): 1, ("acked", 2): 1, ("dead", 1): 1}
    reasons = {(r["event"], r["reason"]): r["events"] for r in tables.reasons.collect()}
    assert reasons == {("dead", "bad input"): 1, ("expired", "ttl"): 1, ("nacked", "boom"): 1}
    throughput = {(r["bin_ms"] - T0, r["event"]): r["events"] for r in tables.throughput.collect()}
    assert throughput == {
        (0, "enqueued"): 7,
        (1000, "delivered"): 3,
        (1000, "acked"): 1,
        (2000, "delivered"): 1,
        (2000, "acked"): 1,
    }
    backlog = {r["due_hour_ms"] - T0: r["jobs"] for r in tables.backlog.collect()}
    assert backlog == {2 * HOUR: 2, 3 * HOUR: 1}


async def test_export_is_incremental_and_the_report_writes_tables_and_charts(
    spark: SparkSession, aredis: aioredis.Redis, redis_url: str, tmp_path: Path
) -> None:
    h = await script_history(aredis)
    out = str(tmp_path / "events")
    first = export(spark, redis_url, out, page=4)  # several XRANGE pages per shard
    assert export(spark, redis_url, out)["events"] == 0  # nothing new
    await h.enqueue(T0 + 5000, spec(delay_ms=1000))
    assert export(spark, redis_url, out)["events"] == 1
    events = read_events(spark, out)
    assert events.count() == first["events"] + 1
    assert events.select("id").distinct().count() == events.count()

    html = report(spark, out, str(tmp_path / "report"), bin_ms=1000)

    check_report_files(Path(html))
    summary = spark.read.parquet(str(tmp_path / "report" / "summary")).first()
    assert summary is not None and summary["enqueued"] == 8
