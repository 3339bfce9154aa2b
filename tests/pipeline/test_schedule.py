"""Bulk scheduling through real Spark (local mode), a real server and Redis."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import redis
from pyspark.sql import SparkSession

from delayq import JobState
from delayq.admin import AdminClient
from delayq_pipeline.prepare import ColumnMapping
from delayq_pipeline.schedule import schedule
from delayq_pipeline.sender import ClientSettings, Item


def stored_jobs(rdb: redis.Redis, queue: str) -> int:
    """Job records of the queue's shard in Redis (the ground truth, not the summary)."""
    groups = rdb.scan_iter(match=f"dq:{{default/{queue}/0}}:r:*", count=1000)
    return sum(int(rdb.hlen(g)) for g in groups)


def write_parquet(spark: SparkSession, path: Path, queue: str, n: int, partitions: int = 4) -> str:
    due = datetime.now(UTC) + timedelta(hours=1)
    rows = [(f"k-{i}", queue, f"payload {i}", due + timedelta(seconds=i)) for i in range(n)]
    df = spark.createDataFrame(rows, "key string, queue string, body string, due timestamp")
    df.repartition(partitions).write.parquet(str(path))
    return str(path)


MAPPING = ColumnMapping(queue_col="queue", payload_col="body", due_col="due", key_col="key")


def test_running_the_job_twice_stores_each_row_once(
    spark: SparkSession, client: ClientSettings, rdb: redis.Redis, queue: str, tmp_path: Path
) -> None:
    data = write_parquet(spark, tmp_path / "jobs", queue, 300)

    first, _ = schedule(spark, [data], MAPPING, client)
    second, _ = schedule(spark, [data], MAPPING, client)

    assert (first.rows_read, first.enqueued, first.duplicates, first.rejected) == (300, 300, 0, 0)
    assert (second.rows_read, second.enqueued, second.duplicates, second.rejected) == (
        300,
        0,
        300,
        0,
    )
    assert stored_jobs(rdb, queue) == 300


def test_rows_without_a_key_column_are_keyed_by_their_content(
    spark: SparkSession, client: ClientSettings, rdb: redis.Redis, queue: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        "".join(f'{{"n": {i}, "msg": {{"to": "u{i}"}}}}\n' for i in range(40)), encoding="utf-8"
    )
    mapping = ColumnMapping(queue=queue, payload_col="msg", delay_ms=3_600_000)

    first, _ = schedule(spark, [str(tmp_path / "*.jsonl")], mapping, client)
    second, _ = schedule(spark, [str(path)], mapping, client)

    assert (first.enqueued, second.enqueued, second.duplicates) == (40, 0, 40)
    assert stored_jobs(rdb, queue) == 40


def test_bad_rows_land_in_rejects_with_their_reason(
    spark: SparkSession, client: ClientSettings, rdb: redis.Redis, queue: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.csv"
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "queue", "body", "due"])
        w.writerow(["ok", queue, "fine", tomorrow])
        w.writerow(["nodue", queue, "x", ""])
        w.writerow(["garbled", queue, "x", "next tuesday"])
        w.writerow(["huge", queue, "y" * 2000, tomorrow])
        w.writerow(["badqueue", "no spaces allowed", "x", tomorrow])
    mapping = ColumnMapping(
        queue_col="queue", payload_col="body", due_col="due", key_col="key", max_payload_bytes=1000
    )

    summary, _rejects = schedule(
        spark, [str(path)], mapping, client, rejects_path=str(tmp_path / "rejects")
    )

    assert (summary.rows_read, summary.enqueued, summary.rejected) == (5, 1, 4)
    written = spark.read.parquet(str(tmp_path / "rejects"))
    by_key = {r["key"]: r for r in written.collect()}
    assert set(by_key) == {"nodue", "garbled", "huge", "badqueue"}
    assert by_key["nodue"]["reason"] == "due time is null (column due)"
    assert by_key["garbled"]["reason"] == "due time next tuesday is not a timestamp (column due)"
    assert by_key["huge"]["reason"] == "payload 2000 bytes is over the 1000-byte limit"
    assert by_key["badqueue"]["stage"] == "server"
    assert by_key["badqueue"]["reason"].startswith("INVALID_ARGUMENT: requests[")
    assert "queue" in by_key["badqueue"]["reason"]
    # Every reject keeps its input row, server refusals included.
    assert '"key":"badqueue"' in by_key["badqueue"]["row"]
    assert '"body":"fine"' not in "".join(r["row"] for r in by_key.values())
    assert stored_jobs(rdb, queue) == 1


class DieOnFirstAttempt:
    """Kills the Python worker after `after` rows of the first attempt (marker file)."""

    def __init__(self, marker: Path, after: int) -> None:
        self.marker = str(marker)
        self.after = after

    def __call__(self, items: Iterator[Item]) -> Iterator[Item]:
        for n, item in enumerate(items):
            if n == self.after:
                try:
                    fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass  # a retry: let it finish
                else:
                    os.close(fd)
                    os._exit(17)  # like a killed executor: no clean-up, no error reply
            yield item


def test_a_killed_and_retried_task_stores_nothing_twice(
    spark: SparkSession, client: ClientSettings, rdb: redis.Redis, queue: str, tmp_path: Path
) -> None:
    data = write_parquet(spark, tmp_path / "jobs", queue, 400, partitions=1)
    sync = ClientSettings(target=client.target, batch_size=50, in_flight=1)

    summary, _ = schedule(
        spark, [data], MAPPING, sync, items_hook=DieOnFirstAttempt(tmp_path / "died", after=220)
    )

    assert (tmp_path / "died").exists()  # the first attempt really died mid-partition
    assert stored_jobs(rdb, queue) == 400
    # The retry found what the dead attempt had stored (at least 4 whole batches).
    assert summary.duplicates >= 200
    assert summary.enqueued + summary.duplicates == 400
    assert summary.rows_read == 400


def test_a_csv_with_standard_quoting_keeps_its_payloads_exact(
    spark: SparkSession, client: ClientSettings, queue: str, tmp_path: Path
) -> None:
    # What pandas, Excel and Python's csv module write (RFC 4180): a field with a quote,
    # a comma or a line break is quoted, and its quotes are doubled. Spark's CSV reader
    # escapes with a backslash by default and stored `"{""i"": 1}"` for `{"i": 1}`.
    bodies = ['{"i": 1, "to": "a@example.com"}', 'say "hi", then\nleave', "plain"]
    path = tmp_path / "jobs.csv"
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["key", "queue", "body"])
        for i, body in enumerate(bodies):
            w.writerow([f"k{i}", queue, body])
    mapping = ColumnMapping(
        queue_col="queue", payload_col="body", key_col="key", delay_ms=3_600_000
    )

    summary, _ = schedule(spark, [str(path)], mapping, client)

    assert (summary.rows_read, summary.enqueued) == (3, 3)
    with AdminClient(client.target) as admin:
        stored = sorted(j.data.decode() for j in admin.iter_jobs(queue, JobState.SCHEDULED))
    assert stored == sorted(bodies)
