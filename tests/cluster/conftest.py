"""Cluster fixtures: the same server fixtures as tests/e2e, on a 3-master Redis Cluster.

``redis_server`` is overridden here, so every fixture and test that starts a
server replica from ``redis_server.url`` talks to the cluster instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import channel, queue, server, stub
from tests.support.cluster import ManagedCluster

__all__ = ["channel", "queue", "server", "stub"]


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedCluster]:
    with ManagedCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture
def redis_url(redis_server: ManagedCluster) -> str:
    return redis_server.url
