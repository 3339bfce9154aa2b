"""A server with --record-events: every acknowledged enqueue (and ack) is exported exactly once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from delayq import Client, Message
from delayq_pipeline.export import export, read_events
from delayq_pipeline.prepare import ColumnMapping
from delayq_pipeline.schedule import schedule
from delayq_pipeline.sender import ClientSettings
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DelayqProcess]:
    """Its own Redis: a replica without the flag would run transitions unrecorded."""
    with (
        ManagedRedis(tmp_path_factory.mktemp("rec-redis"), appendonly=False) as redis,
        DelayqProcess(redis.url, ["--record-events", "--grace", "2s"]) as server,
    ):
        yield server


def test_every_acknowledged_enqueue_appears_exactly_once(
    spark: SparkSession, recording: DelayqProcess, tmp_path: Path
) -> None:
    queue = "recorded"
    acknowledged: set[str] = set()
    with Client(recording.address) as client:
        # 150 keys, 50 of them sent twice in the same call and again in a second call.
        msgs = [Message(b"x", idempotency_key=f"k{i}") for i in [*range(150), *range(50)]]
        for results in (client.enqueue_many(queue, msgs), client.enqueue_many(queue, msgs[:50])):
            acknowledged |= {r.job_id for r in results if not r.duplicate}
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(120)))
    mapping = ColumnMapping(queue=queue, payload_col="n", delay_ms=0)
    settings = ClientSettings(target=recording.address, batch_size=25, in_flight=2)
    first, _ = schedule(spark, [str(rows)], mapping, settings)
    again, _ = schedule(spark, [str(rows)], mapping, settings)
    assert (len(acknowledged), first.enqueued, again.enqueued) == (150, 120, 0)

    with Client(recording.address) as client:
        stream = client.consume([queue], max_outstanding=100, max_batch=50)
        for acked, delivery in enumerate(stream, start=1):
            client.ack([delivery.lease_token])
            if acked == 270:
                break
        stream.close()  # type: ignore[attr-defined]
        wait_until(lambda: client.stats(queue).acked_total == 270, timeout=30)

    out = str(tmp_path / "events")
    export(spark, recording.redis_url, out)
    events = read_events(spark, out).where(F.col("queue") == queue)
    per_job = {
        (r["event"], r["job_id"]): r["n"]
        for r in events.groupBy("event", "job_id").agg(F.count(F.lit(1)).alias("n")).collect()
    }
    enqueued = {job for (event, job) in per_job if event == "enqueued"}
    assert len(enqueued) == 270 and acknowledged <= enqueued
    assert {job for (event, job) in per_job if event == "acked"} == enqueued
    assert set(per_job.values()) == {1}  # nothing twice, whatever the event
