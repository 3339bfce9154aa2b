"""Store fixtures: the real Lua scripts against the session's redis-server."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from delayq_server.store import Store
from tests.support.seed import Shard


@pytest.fixture
def store(aredis: aioredis.Redis) -> Store:
    return Store(aredis, bucket_width_ms=1000, completed_retention_ms=0)


@pytest.fixture
def shard(store: Store) -> Shard:
    return Shard(store)
