"""Redis down, read-only or out of memory reaches callers as a canonical status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis

from delayq.v1 import service_pb2
from tests.support.digest import data_keys
from tests.support.servers import DelayqProcess, ManagedRedis, free_port

REQ = service_pb2.EnqueueRequest(queue="q", payload=b"x" * 1000)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ManagedRedis]:
    with ManagedRedis(tmp_path, appendonly=False) as r:
        yield r


def test_redis_down_is_unavailable(own_redis: ManagedRedis) -> None:
    with DelayqProcess(own_redis.url) as server, server.channel() as ch:
        stub = server.stub(ch)
        stub.Enqueue(REQ)
        own_redis.stop()
        with pytest.raises(grpc.RpcError) as err:
            stub.Enqueue(REQ, timeout=30)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Redis" in (err.value.details() or "")
        # Issue 9: the status never names Redis' address.
        details = err.value.details() or ""
        assert str(own_redis.port) not in details and "127.0.0.1" not in details


def test_read_only_redis_is_unavailable(own_redis: ManagedRedis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    with DelayqProcess(own_redis.url) as server, server.channel() as ch:
        stub = server.stub(ch)
        stub.Enqueue(REQ)
        client.replicaof("127.0.0.1", str(free_port()))  # a replica refuses writes
        try:
            with pytest.raises(grpc.RpcError) as err:
                stub.Enqueue(REQ, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "read-only" in (err.value.details() or "")
        finally:
            client.replicaof("NO", "ONE")
        stub.Enqueue(REQ, timeout=10)
    client.close()


def test_out_of_memory_is_resource_exhausted_and_writes_nothing(own_redis: ManagedRedis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    with DelayqProcess(own_redis.url) as server, server.channel() as ch:
        stub = server.stub(ch)
        stub.Enqueue(REQ)
        before = data_keys(client)
        client.config_set("maxmemory", "1")
        try:
            with pytest.raises(grpc.RpcError) as err:
                stub.Enqueue(REQ, timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert data_keys(client) == before
        finally:
            client.config_set("maxmemory", "0")
        stub.Enqueue(REQ, timeout=10)
    client.close()
