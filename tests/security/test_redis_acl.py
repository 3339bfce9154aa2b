"""The server runs as a Redis ACL user with only the commands README "Redis ACL" lists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.e2e.test_operations import assert_refused, run_server
from tests.support.rpc import ms
from tests.support.servers import DelayqProcess, ManagedRedis

# Keep in sync with README "Redis ACL": the minimum the server needs.
ACL_COMMANDS = (
    "+ping +time "
    "+evalsha +eval +script|load +script|exists "
    "+get +mget +set +del +exists +pexpire +pexpireat +incr "
    "+hget +hmget +hset +hsetnx +hgetall +hincrby +hdel "
    "+sadd +srem +smembers +sismember +scard "
    "+lpush +rpush +rpop +llen +lindex +lrem "
    "+zadd +zrange +zrem +zcard +zscore +zremrangebyscore +rename "
    "+multi +exec +discard "
    "+spublish +ssubscribe +sunsubscribe"
)
USER_ACL = f"delayq on >s3cret-pass resetkeys ~dq:* resetchannels &dq:* -@all {ACL_COMMANDS}"


@pytest.fixture
def acl_redis(tmp_path: Path) -> ManagedRedis:
    srv = ManagedRedis(tmp_path, appendonly=False, extra=["--user", *USER_ACL.split(" ")])
    srv.start()
    return srv


def test_server_works_as_a_least_privilege_acl_user(acl_redis: ManagedRedis) -> None:
    url = f"redis://delayq:s3cret-pass@127.0.0.1:{acl_redis.port}/0"
    try:
        with DelayqProcess(url, ["--auth"]) as proc, grpc.insecure_channel(proc.address) as ch:
            token = next(
                line.rsplit(" ", 1)[1].strip()
                for line in proc.output
                if "admin token (shown once)" in line
            )
            md = (("authorization", f"Bearer {token}"),)
            s = service_pb2_grpc.DelayQueueServiceStub(ch)
            s.Enqueue(
                service_pb2.EnqueueRequest(queue="acl", payload=b"now"), timeout=10, metadata=md
            )
            s.Enqueue(
                service_pb2.EnqueueRequest(queue="acl", payload=b"later", delay=ms(200)),
                timeout=10,
                metadata=md,
            )
            call = s.Consume(
                service_pb2.ConsumeRequest(queues=["acl"], max_outstanding=10),
                metadata=md,
                timeout=30,
            )
            got: list[Any] = []
            for resp in call:
                got.extend(resp.deliveries)
                if len(got) == 2:
                    break
            acked = s.Ack(
                service_pb2.AckRequest(lease_tokens=[d.lease_token for d in got]),
                timeout=10,
                metadata=md,
            )
            assert list(acked.results) == [service_pb2.ACK_RESULT_ACKED] * 2
            call.cancel()  # type: ignore[no-untyped-call]
            stats = s.GetQueueStats(
                service_pb2.GetQueueStatsRequest(queue="acl"), timeout=10, metadata=md
            )
            assert stats.stats.acked_total == 2
    finally:
        acl_redis.stop()


def test_reflection_can_be_switched_off(redis_url: str) -> None:
    with (
        DelayqProcess(redis_url, ["--no-reflection"]) as proc,
        grpc.insecure_channel(proc.address) as ch,
    ):
        with pytest.raises(grpc.RpcError) as info:
            ProtoReflectionDescriptorDatabase(ch).get_services()
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_user_without_sharded_pubsub_is_refused_at_start(tmp_path: Path) -> None:
    """Wake-ups need SPUBLISH/SSUBSCRIBE (Redis 7.0): the grant of classic pub/sub
    alone (or a Redis older than 7.0) is one clear line at start, not silent waits."""
    classic = USER_ACL.replace("+spublish +ssubscribe +sunsubscribe", "+publish +subscribe")
    assert classic != USER_ACL
    with ManagedRedis(tmp_path, appendonly=False, extra=["--user", *classic.split(" ")]) as r:
        url = f"redis://delayq:s3cret-pass@127.0.0.1:{r.port}/0"
        proc = run_server("--redis-url", url, "--listen", "127.0.0.1:0")
    assert_refused(proc, "refused SPUBLISH", "Redis 7.0 or later", "+spublish")
    assert "s3cret" not in proc.stderr
