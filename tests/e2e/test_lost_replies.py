"""A reply lost between the server and Redis costs no attempt and hides no job."""

from __future__ import annotations

import hashlib
from pathlib import Path

from delayq.v1 import service_pb2
from delayq_server.store import scripts
from tests.support.proxy import ThreadedProxy
from tests.support.rpc import Consumer, ack, enqueue
from tests.support.servers import DelayqProcess, ManagedRedis


def test_lost_claim_reply_still_delivers_on_the_first_attempt(tmp_path: Path) -> None:
    claim_sha = hashlib.sha1(scripts.source("claim").encode()).hexdigest().encode()
    with (
        ManagedRedis(tmp_path, appendonly=False) as redis,
        ThreadedProxy("127.0.0.1", redis.port) as proxy,
        DelayqProcess(proxy.url) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        with Consumer(stub, ["lost"]) as c:
            proxy.drop_reply_to(claim_sha)
            job_id = enqueue(stub, "lost")
            assert proxy.wait_dropped(30)  # the claim ran and its reply was lost
            (d,) = c.take(1, timeout=30)
            assert d.job.id == job_id
            assert d.job.attempts == 1  # the re-sent claim did not count a second one
            assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]  # the lease is real
