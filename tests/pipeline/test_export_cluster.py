"""delayq-pipeline export reads the per-shard event streams of a Redis Cluster
(redis+cluster:// URL, the same one the server takes), shards spread over nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from delayq import Client, Message
from delayq_pipeline.export import export, read_events
from tests.support.cluster import ManagedCluster
from tests.support.servers import DelayqProcess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedCluster]:
    with ManagedCluster(tmp_path_factory.mktemp("export-cluster")) as c:
        yield c


def test_export_reads_every_shard_of_a_cluster(
    cluster: ManagedCluster, spark: SparkSession, tmp_path: Path
) -> None:
    queue = "spread-export"
    args = ["--record-events", "--shards-per-queue", "6", "--grace", "2s"]
    with DelayqProcess(cluster.url, args) as server, Client(server.address) as client:
        results = client.enqueue_many(
            queue, [Message(b"x", idempotency_key=f"k{i}") for i in range(60)]
        )
    job_ids = {r.job_id for r in results}
    out = str(tmp_path / "events")
    summary = export(spark, cluster.url, out)
    events = read_events(spark, out).where(F.col("queue") == queue)
    rows = events.select("job_id", "event", "shard").collect()
    assert {r["job_id"] for r in rows if r["event"] == "enqueued"} == job_ids
    assert len(rows) == 60  # once each
    assert len({r["shard"] for r in rows}) == 6  # every shard's stream was read
    assert summary["events"] >= 60 and summary["shards"] >= 6
    again = export(spark, cluster.url, out)  # incremental: nothing new
    assert again["events"] == 0
    assert read_events(spark, out).where(F.col("queue") == queue).count() == 60
