"""A queue with several shards spreads over the cluster's nodes and is consumed fairly."""

from __future__ import annotations

from collections import Counter

from delayq.v1 import service_pb2
from tests.support.cluster import ManagedCluster
from tests.support.rpc import Consumer, ack
from tests.support.servers import DelayqProcess


def test_shards_of_one_queue_spread_over_nodes_and_merge_fairly(
    redis_server: ManagedCluster,
) -> None:
    shards = 6
    with (
        DelayqProcess(redis_server.url, ["--shards-per-queue", str(shards)]) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        reqs = [service_pb2.EnqueueRequest(queue="spread", payload=b"x") for _ in range(60)]
        resp = stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs), timeout=10)
        per_shard = Counter(int(r.response.job_id.rsplit("-", 1)[1]) for r in resp.results)
        assert sorted(per_shard) == list(range(shards))  # every shard got jobs
        assert max(per_shard.values()) - min(per_shard.values()) <= 1  # evenly
        nodes = {
            redis_server.master_of(f"dq:{{default/spread/{s}}}:ready").port for s in range(shards)
        }
        assert len(nodes) >= 2, nodes  # one queue, several Redis nodes

        # Consume takes from every shard in turn, one delivery at a time.
        order = []
        with Consumer(stub, ["spread"], max_outstanding=1) as c:
            for _ in range(2 * shards):
                (d,) = c.take()
                order.append(int(d.job.id.rsplit("-", 1)[1]))
                assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]
        assert Counter(order) == Counter({s: 2 for s in range(shards)}), order
