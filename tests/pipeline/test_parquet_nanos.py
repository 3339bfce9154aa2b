"""Parquet files written by pandas: datetime64[ns] columns are INT64 TIMESTAMP(NANOS),
which Spark 3.5 reads only as longs of nanoseconds; their due times must come out right."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd  # type: ignore[import-untyped]  # no stubs installed
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from delayq import JobState
from delayq.admin import AdminClient
from delayq_pipeline.prepare import ColumnMapping, read_dataset
from delayq_pipeline.schedule import schedule
from delayq_pipeline.sender import ClientSettings
from tests.support.servers import DelayqProcess

# Spark reads INT64 TIMESTAMP(NANOS) only with this (as longs); session.py sets it.
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"
MAPPING = ColumnMapping(queue_col="queue", payload_col="body", due_col="due", key_col="key")


def pandas_jobs(path: Path, queue: str, *, naive: bool = False) -> dict[str, datetime]:
    """Writes three jobs the way pandas does by default; returns each body's expected due time.

    Sub-millisecond parts are dropped (floored), as for any timestamp due column: .999999999
    stays in its second.
    """
    base = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    start = pd.Timestamp(base.replace(tzinfo=None) if naive else base)
    nanos = {"b0": 123_456_789, "b1": 1_999_999_999, "b2": 2_000_000_500}
    frame = pd.DataFrame(
        {
            "key": [f"k-{body}" for body in nanos],
            "queue": queue,
            "body": list(nanos),
            "due": [start + pd.Timedelta(nanoseconds=n) for n in nanos.values()],
        }
    )
    frame.to_parquet(path)
    # What pyarrow writes for datetime64[ns] by default (not coerced to microseconds).
    written = pq.read_schema(path).field("due").type
    assert written == pa.timestamp("ns", tz=None if naive else "UTC"), written
    return {body: base + timedelta(milliseconds=n // 1_000_000) for body, n in nanos.items()}


def stored_due_times(address: str, queue: str) -> dict[str, datetime | None]:
    with AdminClient(address) as admin:
        return {j.data.decode(): j.due_time for j in admin.iter_jobs(queue, JobState.SCHEDULED)}


@pytest.mark.parametrize("naive", [False, True], ids=["utc", "naive"])
def test_pandas_nanosecond_due_times_are_scheduled_to_the_millisecond(
    spark: SparkSession,
    client: ClientSettings,
    pipeline_server: DelayqProcess,
    queue: str,
    tmp_path: Path,
    naive: bool,
) -> None:
    path = tmp_path / "jobs.parquet"
    expected = pandas_jobs(path, queue, naive=naive)

    summary, _ = schedule(spark, [str(path)], MAPPING, client)

    assert (summary.rows_read, summary.enqueued, summary.rejected) == (3, 3, 0)
    assert stored_due_times(pipeline_server.address, queue) == expected


def test_the_schedule_command_takes_a_pandas_parquet_file(
    pipeline_server: DelayqProcess, redis_url: str, queue: str, tmp_path: Path
) -> None:
    # As a user runs it: its own Spark session (session.py's settings), a real server.
    path = tmp_path / "jobs.parquet"
    expected = pandas_jobs(path, queue)
    command = Path(sys.executable).parent / "delayq-pipeline"
    args = ["--queue-col", "queue", "--payload-col", "body", "--due-col", "due", "--key-col", "key"]
    done = subprocess.run(
        [str(command), "schedule", str(path), *args, "--target", pipeline_server.address],
        capture_output=True,
        text=True,
        timeout=100,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert '"enqueued": 3' in done.stdout
    assert stored_due_times(pipeline_server.address, queue) == expected


def test_files_that_disagree_on_the_unit_of_a_column_are_refused(
    spark: SparkSession, queue: str, tmp_path: Path
) -> None:
    # One file in nanoseconds, one in microseconds: Spark reads all of them with the
    # schema of one, and would take the other's integers for the wrong unit.
    data = tmp_path / "jobs"
    data.mkdir()
    pandas_jobs(data / "a.parquet", queue)
    micros = pa.table({"due": pa.array([datetime.now(UTC)], pa.timestamp("us", tz="UTC"))})
    pq.write_table(micros, data / "b.parquet")

    with pytest.raises(ValueError, match="column due is a nanosecond timestamp in") as err:
        read_dataset(spark, [str(data)])
    assert "coerce_timestamps" in str(err.value)


def test_a_parquet_type_spark_cannot_read_is_named(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "times.parquet"
    pd.DataFrame({"at": [dt.time(10, 30)]}).to_parquet(path)  # Parquet TIME: no Spark type

    with pytest.raises(ValueError) as err:
        read_dataset(spark, [str(path)])

    message = str(err.value)
    assert message.startswith(f"cannot read {path}: Spark has no type for Parquet's")
    assert "INT64 (TIME(MICROS,false))" in message and "\n" not in message


def test_nanosecond_timestamps_need_the_session_setting(
    spark: SparkSession, queue: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.parquet"
    pandas_jobs(path, queue)
    spark.conf.set(NANOS_AS_LONG, "false")  # as with --conf spark.sql.legacy...=false
    try:
        with pytest.raises(ValueError, match=f"needs {NANOS_AS_LONG}=true"):
            read_dataset(spark, [str(path)])
    finally:
        spark.conf.set(NANOS_AS_LONG, "true")
