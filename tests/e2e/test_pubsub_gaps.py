"""Wake-ups lost while pub/sub was away: a re-subscribe re-checks, a dead subscriber is found.

The server runs with a one-hour wake-up fallback, so a delivery here can only
come from the re-check after a re-subscribe, never from the fallback timer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from delayq_server.store import Store
from delayq_server.store import store as store_module
from tests.support.proxy import ThreadedProxy
from tests.support.rpc import Consumer, Stub, ack, enqueue
from tests.support.seed import spec
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until

ARGS = ["--wake-fallback", "1h"]


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ManagedRedis]:
    with ManagedRedis(tmp_path, appendonly=False) as r:
        yield r


def _idle_stream(stub: Stub, c: Consumer, queue: str) -> None:
    """Proves the stream is open and idle: one job through it end to end."""
    enqueue(stub, queue)
    (d,) = c.take(1, timeout=30)
    ack(stub, d.lease_token)


async def _enqueue_without_wakeup(url: str, queue: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Stores a ready job whose "ready" event goes nowhere: an event lost in a gap."""
    import redis.asyncio as aioredis

    from delayq_server.store import ShardKeys

    monkeypatch.setattr(store_module, "shard_channel", lambda keys: "dq:{nobody}:ch")
    client = aioredis.Redis.from_url(url)
    try:
        job = spec(delay_ms=0)
        (res,), _ = await Store(client).enqueue(ShardKeys("default", queue, 0), [job])
        return res.job_id
    finally:
        await client.aclose()


async def test_silent_reconnect_after_client_kill_rechecks(
    own_redis: ManagedRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    with DelayqProcess(own_redis.url, ARGS) as server, server.channel() as ch:
        stub = server.stub(ch)
        with Consumer(stub, ["gap"]) as c:
            _idle_stream(stub, c, "gap")
            job_id = await _enqueue_without_wakeup(own_redis.url, "gap", monkeypatch)
            assert client.client_kill_filter(_type="pubsub") >= 1
            # redis-py reconnects and re-subscribes by itself; that must re-check.
            (d,) = c.take(1, timeout=20)
            assert d.job.id == job_id
    client.close()


def test_half_open_subscriber_is_replaced_and_rechecks(own_redis: ManagedRedis) -> None:
    with (
        ThreadedProxy("127.0.0.1", own_redis.port) as proxy,
        DelayqProcess(proxy.url, ARGS) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        with Consumer(stub, ["half"]) as c:
            _idle_stream(stub, c, "half")
            assert proxy.stall_subscribers() >= 1  # its socket looks fine but is dead
            job_id = enqueue(stub, "half")  # its "ready" event is swallowed
            (d,) = c.take(1, timeout=20)  # found by the PING deadline, then re-checked
            assert d.job.id == job_id
        wait_until(lambda: any("no PING reply" in line for line in server.output), 10)
