"""Durability level "AOF always": a crash of Redis loses nothing acknowledged.

kill -9 of redis-server alone proves nothing about fsync: the OS page cache
keeps every written byte, so `everysec` would pass too. Redis runs here under
an LD_PRELOAD shim (unsynced_writes.c) that holds AOF writes in the process
until they are fsynced, so kill -9 loses exactly what a power cut would. The
same check run against `everysec` must find losses, which shows it can fail.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import redis

from delayq.v1 import service_pb2
from tests.support.rpc import ms, query
from tests.support.servers import DelayqProcess, ManagedRedis

JOBS = 200


def persistence(url: str) -> dict[str, object]:
    """Redis' own view: AOF on, its fsync policy, and the last write went through."""
    client = redis.Redis.from_url(url)
    try:
        info = dict(client.info("persistence"))
        info["appendfsync"] = client.config_get("appendfsync")["appendfsync"]
        return info
    finally:
        client.close()


def lost_after_crash(data: Path, shim: Path, appendfsync: str) -> tuple[int, int]:
    """Acknowledged enqueues, kill -9 of Redis, restart: (acknowledged, lost)."""
    env = {**os.environ, "LD_PRELOAD": str(shim)}
    redis_server = ManagedRedis(data, appendonly=True, appendfsync=appendfsync, env=env).start()
    acknowledged: list[str] = []
    try:
        with DelayqProcess(redis_server.url) as server, server.channel() as ch:
            stub = server.stub(ch)
            seen = persistence(redis_server.url)
            assert seen["aof_enabled"] == 1 and seen["appendfsync"] == appendfsync
            for i in range(JOBS):
                req = service_pb2.EnqueueRequest(
                    queue="durable", payload=str(i).encode(), delay=ms(3_600_000)
                )
                acknowledged.append(stub.Enqueue(req, timeout=10).job_id)
            assert persistence(redis_server.url)["aof_last_write_status"] == "ok"
            redis_server.stop(sig_kill=True)  # no shutdown fsync: only synced bytes survive
            redis_server.start()  # same directory and port
            lost = 0
            for job_id in acknowledged:
                try:
                    query(stub, "durable", job_id)
                except grpc.RpcError as err:
                    assert err.code() == grpc.StatusCode.NOT_FOUND
                    lost += 1
            return len(acknowledged), lost
    finally:
        redis_server.stop()


def test_sigkill_of_redis_loses_no_acknowledged_enqueue(
    tmp_path: Path, unsynced_shim: Path
) -> None:
    acknowledged, lost = lost_after_crash(tmp_path, unsynced_shim, "always")
    assert (acknowledged, lost) == (JOBS, 0)


def test_the_same_check_finds_losses_under_everysec(tmp_path: Path, unsynced_shim: Path) -> None:
    """The check can fail: with `everysec` the writes since the last fsync are lost.

    A kill right after an fsync that happened to cover the last write loses
    nothing, so up to three crashes are tried (each a ~1 s window).
    """
    losses = []
    for attempt in range(3):
        _, lost = lost_after_crash(tmp_path / str(attempt), unsynced_shim, "everysec")
        losses.append(lost)
        if lost:
            break
    print(f"everysec: lost {losses} of {JOBS} acknowledged enqueues per crash")
    assert any(losses), losses
