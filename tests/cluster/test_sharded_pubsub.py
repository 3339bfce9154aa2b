"""Wake-ups on a cluster are sharded: each shard's channel lives on the node that
owns the shard, and no event crosses the cluster bus to the other masters."""

from __future__ import annotations

from typing import Any

import redis

from delayq.v1 import service_pb2
from tests.support.cluster import ManagedCluster
from tests.support.rpc import Consumer, ack, enqueue, ms
from tests.support.servers import DelayqProcess, wait_until

SHARDS = 6


def _bus_publishes(cluster: ManagedCluster) -> int:
    """Classic PUBLISH messages the masters forwarded over the cluster bus."""
    total = 0
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            info: Any = r.execute_command("CLUSTER INFO")
        total += int(info.get("cluster_stats_messages_publish_sent", 0))
    return total


def _subscribers(cluster: ManagedCluster, channel: str) -> dict[int, int]:
    """Shard-channel subscribers of ``channel`` as each node counts them."""
    out = {}
    for node in cluster.nodes:
        with redis.Redis(port=node.port) as r:
            ((_, count),) = r.pubsub_shardnumsub(channel)
            out[node.port] = int(count)
    return out


def test_events_stay_on_the_shards_node(redis_server: ManagedCluster) -> None:
    queue = "sharded-events"
    channels = [f"dq:{{default/{queue}/{s}}}:ch" for s in range(SHARDS)]
    with (
        DelayqProcess(redis_server.url, ["--shards-per-queue", str(SHARDS)]) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        enqueue(stub, queue, delay=ms(3_600_000))  # creates the queue: its channels follow
        for channel in channels:
            owner = redis_server.master_of(channel).port
            # Subscribed where the shard lives (a session-wide replica may
            # subscribe too), and nowhere else.
            wait_until(lambda c=channel, o=owner: _subscribers(redis_server, c)[o] >= 1, 20)
            others = {p: n for p, n in _subscribers(redis_server, channel).items() if p != owner}
            assert set(others.values()) == {0}, others
        for node in redis_server.nodes:  # no classic (broadcast) channel anywhere
            with redis.Redis(port=node.port) as r:
                assert r.pubsub_channels() == [], node.port

        before = _bus_publishes(redis_server)
        with Consumer(stub, [queue]) as c:
            # Every kind of event: "due" (delayed jobs), "ready" (promoted and
            # direct), "lease" (claims), and credit messages (acks).
            due = [enqueue(stub, queue, delay=ms(200)) for _ in range(2 * SHARDS)]
            now = [enqueue(stub, queue) for _ in range(2 * SHARDS)]
            got = c.take(len(due) + len(now), timeout=30)
            assert {d.job.id for d in got} == set(due + now)
            for d in got:
                assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]
        assert _bus_publishes(redis_server) == before  # nothing broadcast to other nodes
