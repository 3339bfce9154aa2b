"""Durability level "AOF always": kill -9 of Redis loses nothing acknowledged."""

from __future__ import annotations

from pathlib import Path

from delayq.v1 import service_pb2
from tests.support.rpc import ms, query, stats
from tests.support.servers import DelayqProcess, ManagedRedis


def test_sigkill_of_redis_loses_no_acknowledged_enqueue(tmp_path: Path) -> None:
    redis = ManagedRedis(tmp_path, appendonly=True, appendfsync="always").start()
    acknowledged: list[str] = []
    try:
        with DelayqProcess(redis.url) as server, server.channel() as ch:
            stub = server.stub(ch)
            for i in range(200):
                req = service_pb2.EnqueueRequest(
                    queue="durable", payload=str(i).encode(), delay=ms(3_600_000)
                )
                acknowledged.append(stub.Enqueue(req, timeout=10).job_id)
            redis.stop(sig_kill=True)  # no shutdown save: only the AOF survives
            redis.start()  # same directory and port
            for job_id in acknowledged:
                assert query(stub, "durable", job_id).payload  # every acknowledged job is back
            assert stats(stub, "durable").scheduled == 200
    finally:
        redis.stop()
