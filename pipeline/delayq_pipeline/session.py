"""One configured SparkSession: loopback driver, the venv's Python, bounded memory."""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

__all__ = ["NANOS_AS_LONG", "SparkSettings", "free_port", "spark_session"]

# Parquet's INT64 TIMESTAMP(NANOS), what pandas writes for datetime64[ns]: Spark 3.5 has
# no type for it and refuses the file unless this reads it as longs of nanoseconds
# (prepare.read_dataset turns those back into timestamps by the files' footers).
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"


def free_port() -> int:
    """A free loopback TCP port (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class SparkSettings:
    """How to start Spark; the defaults suit one machine (local mode)."""

    master: str = "local[*]"
    app_name: str = "delayq-pipeline"
    driver_memory: str = "1g"
    ui: bool = False
    # 0 = let the OS pick (a free port chosen here, never Spark's fixed 4040/random retry).
    driver_port: int = 0
    shuffle_partitions: int = 8
    extra: dict[str, str] = field(default_factory=dict)


def _environment() -> None:
    # A machine with several interfaces (or none resolvable) makes Spark warn and
    # sometimes bind the wrong one; executors must run the interpreter that has
    # delayq and grpc installed, not whatever `python3` is on PATH.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def spark_session(settings: SparkSettings | None = None) -> SparkSession:
    """Starts (or returns the running) SparkSession with delayq's settings."""
    s = settings or SparkSettings()
    _environment()
    builder = (
        SparkSession.builder.master(s.master)
        .appName(s.app_name)
        .config("spark.driver.memory", s.driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.port", str(s.driver_port or free_port()))
        .config("spark.blockManager.port", str(free_port()))
        .config("spark.port.maxRetries", "32")
        .config("spark.ui.enabled", "true" if s.ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(s.shuffle_partitions))
        # Python workers are reused across tasks so the gRPC import happens once.
        .config("spark.python.worker.reuse", "true")
        .config(NANOS_AS_LONG, "true")
    )
    for key, value in s.extra.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
