"""Timer work is shared, not repeated: each shard's timers run on one replica,
and move to another within a few seconds when their owner dies."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from delayq.v1 import service_pb2
from delayq_server.store import ShardKeys
from delayq_server.timers.ownership import preferred
from tests.support.rpc import Consumer, enqueue, ms
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[ManagedRedis]:
    """A Redis of its own: the session's server replica must not share the shards."""
    with ManagedRedis(tmp_path, appendonly=False) as r:
        yield r


def _owners(client: redis.Redis, queue: str, shards: int) -> list[str]:
    raw: list[bytes | None] = [
        client.get(f"dq:{{default/{queue}/{s}}}:owner")  # type: ignore[misc]
        for s in range(shards)
    ]
    return [(r or b"").decode() for r in raw]


def _server_id(proc: DelayqProcess) -> str:
    """The replica's id, from the lease nonces it hands out (server.stream.claim.n)."""
    with proc.channel() as ch, Consumer(proc.stub(ch), ["whoami"]) as c:
        enqueue(proc.stub(ch), "whoami")
        (d,) = c.take()
        proc.stub(ch).Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]))
    return d.lease_token.rsplit("/", 1)[1].split(".")[0]


def test_each_shard_has_one_owner_and_ownership_moves_when_it_dies(
    own_redis: ManagedRedis,
) -> None:
    queue, shards = "owned", 4
    args = ["--shards-per-queue", str(shards)]
    client = redis.Redis.from_url(own_redis.url)
    a = DelayqProcess(own_redis.url, args).start()
    try:
        with DelayqProcess(own_redis.url, args) as b, b.channel() as ch:
            stub = b.stub(ch)
            for _ in range(shards):
                enqueue(stub, queue, delay=ms(3_600_000))  # creates the queue everywhere
            victim, survivor = _server_id(a), _server_id(b)
            # Shared, not repeated: each shard has one owner, the one rendezvous hashing
            # prefers among the two live replicas. (With random server ids one replica
            # may be preferred for all 4 shards, 1 run in 8: the test names the owners.)
            want = [
                preferred(ShardKeys("default", queue, s), [victim, survivor]) for s in range(shards)
            ]
            wait_until(lambda: _owners(client, queue, shards) == want, 20)
            print("owners per shard:", _owners(client, queue, shards))
            a.kill()  # SIGKILL: its ownership leases are not given back
            # Every shard, those of the dead replica included, ends up owned by b.
            wait_until(lambda: set(_owners(client, queue, shards)) == {survivor}, 15)
            # The promoter that took over delivers a job due after the takeover.
            with Consumer(stub, [queue]) as c:
                due = [enqueue(stub, queue, delay=ms(300)) for _ in range(2 * shards)]
                got = {d.job.id for d in c.take(len(due), timeout=30)}
            assert set(due) <= got
            assert victim not in _owners(client, queue, shards)
    finally:
        a.kill()
        client.close()


def test_graceful_stop_hands_ownership_over_at_once(own_redis: ManagedRedis) -> None:
    client = redis.Redis.from_url(own_redis.url)
    a = DelayqProcess(own_redis.url).start()
    try:
        with a.channel() as ch:
            enqueue(a.stub(ch), "handover", delay=ms(3_600_000))
        wait_until(lambda: _owners(client, "handover", 1) != [""], 10)
        assert a.terminate() == 0
        # Given up on SIGTERM, not left to run out.
        assert _owners(client, "handover", 1) == [""]
        started = time.monotonic()
        with DelayqProcess(own_redis.url) as b:
            wait_until(lambda: _owners(client, "handover", 1) != [""], 15)
            print(f"new owner after {time.monotonic() - started:.2f}s (incl. start)")
            assert b.port
    finally:
        a.kill()
        client.close()
