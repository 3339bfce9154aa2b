"""End-to-end fixtures: the real server process over real gRPC, on a real Redis."""

from __future__ import annotations

import re
from collections.abc import Iterator

import grpc
import pytest

from delayq.v1 import service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

# Completed jobs are retained so Query can show JOB_STATE_COMPLETED.
SERVER_ARGS = ["--completed-retention", "60s", "--grace", "5s"]


@pytest.fixture(scope="session")
def server(redis_server: ManagedRedis) -> Iterator[DelayqProcess]:
    with DelayqProcess(redis_server.url, SERVER_ARGS) as proc:
        yield proc


@pytest.fixture(scope="session")
def channel(server: DelayqProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> service_pb2_grpc.DelayQueueServiceStub:
    return service_pb2_grpc.DelayQueueServiceStub(channel)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    """A queue name unique to the test, so tests share one server without interfering."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]
