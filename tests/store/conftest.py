"""Store fixtures: the real Lua scripts against the session's redis-server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace

import pytest
import redis.asyncio as aioredis

from delayq_server import stream as stream_module
from delayq_server.store import Store
from tests.support.seed import Shard
from tests.support.servers import ManagedRedis
from tests.support.streams import StreamClock, Streams


@pytest.fixture
def store(aredis: aioredis.Redis) -> Store:
    return Store(aredis, bucket_width_ms=1000, completed_retention_ms=0)


@pytest.fixture
def shard(store: Store) -> Shard:
    return Shard(store)


@pytest.fixture
async def streams(store: Store, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Streams]:
    """Consume streams on the real store, their clock moved by the test."""
    clock = StreamClock()
    monkeypatch.setattr(stream_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    opened = Streams(store, clock)
    yield opened
    await opened.close()


@pytest.fixture(scope="module")
def quiet_redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server nobody else uses, for tests that count commands (INFO
    commandstats is server-wide). The session's shared redis-server also serves the
    e2e suite's server, whose timers may run scripts at any moment of a later test."""
    with ManagedRedis(tmp_path_factory.mktemp("quiet"), appendonly=False) as server:
        yield server.url


@pytest.fixture
async def quiet_redis(quiet_redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(quiet_redis_url, decode_responses=False)
    await client.flushall()
    yield client
    await client.aclose()
