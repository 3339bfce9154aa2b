"""Session fixtures: a real redis-server on a free port, flushed per test.

No fakes: a missing redis-server fails the session loudly.
"""

from __future__ import annotations

import os

# Tests fork children (redis-server, spark-submit) from a process whose gRPC
# threads are busy; gRPC's fork handlers then abort the child before it execs
# (SIGABRT, "epoll_wait error: Bad file descriptor"). No child here uses gRPC
# state inherited from the parent, so the handlers are turned off. Set before
# anything imports grpc.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from tests.support.auth import AuthServer, auth_server
from tests.support.servers import ManagedRedis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedRedis]:
    data: Path = tmp_path_factory.mktemp("redis")
    with ManagedRedis(data, appendonly=False) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: ManagedRedis) -> Iterator[str]:
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url


@pytest.fixture
async def aredis(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url, decode_responses=False)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def auth_srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    """A server with --auth on its own redis-server, shared by the session's auth tests
    (each test works in its own namespaces)."""
    with auth_server(tmp_path_factory.mktemp("auth")) as srv:
        yield srv
