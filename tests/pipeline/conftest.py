"""Pipeline fixtures: one local Spark session per test session, a real server and Redis."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from delayq_pipeline.sender import ClientSettings
from delayq_pipeline.session import SparkSettings, spark_session
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Executors import the tests' partition hooks by module name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    # local[2,4]: two task slots, and a failed task is tried up to 4 times (the
    # retry test relies on it). The driver stays ~1 GB: the data here is small.
    session = spark_session(
        SparkSettings(master="local[2,4]", app_name="delayq-tests", ui=False, shuffle_partitions=2)
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pipeline_server(redis_server: ManagedRedis) -> Iterator[DelayqProcess]:
    with DelayqProcess(redis_server.url, ["--grace", "2s"]) as proc:
        yield proc


@pytest.fixture
def client(pipeline_server: DelayqProcess, redis_url: str) -> ClientSettings:
    """Client settings for the test's server; Redis is flushed first (redis_url)."""
    return ClientSettings(target=pipeline_server.address, batch_size=50, in_flight=2)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]


@pytest.fixture
def rdb(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pyspark's py4j client leaves result sockets for the garbage collector;
    # that is pyspark's, not ours, and would fail these tests under -W error.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.filterwarnings("ignore::ResourceWarning"))
            item.add_marker(
                pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
            )
            # pyspark 3.5 compares the pandas/pyarrow versions with distutils' LooseVersion.
            item.add_marker(
                pytest.mark.filterwarnings("ignore:distutils Version classes:DeprecationWarning")
            )
