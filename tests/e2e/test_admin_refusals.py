"""Refusals of every queue administration RPC (issue 14): canonical code, the field
named, and Redis untouched."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.protobuf import duration_pb2, field_mask_pb2, timestamp_pb2

from delayq.v1 import admin_pb2, admin_pb2_grpc, job_pb2, service_pb2
from tests.support.auth import AuthServer
from tests.support.digest import redis_digest
from tests.support.rpc import ms
from tests.support.servers import DelayqProcess, ManagedRedis

A = admin_pb2
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
FAILED = grpc.StatusCode.FAILED_PRECONDITION
EXISTS = grpc.StatusCode.ALREADY_EXISTS
GOOD_ID = "06h03hkqjpgep0lubf6r2to"
IDS: dict[str, str] = {}


def _mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))


@pytest.fixture(scope="module")
def isolated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[admin_pb2_grpc.AdminServiceStub, redis.Redis]]:
    """A server on a Redis of its own, with a queue "known" holding a scheduled,
    a leased, a dead and a deleted job."""
    with (
        ManagedRedis(Path(tmp_path_factory.mktemp("admin-refusals")), appendonly=False) as r,
        DelayqProcess(r.url) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        E = service_pb2.EnqueueRequest
        IDS["dead"] = stub.Enqueue(E(queue="known", payload=b"d", max_attempts=1)).job_id
        call = stub.Consume(service_pb2.ConsumeRequest(queues=["known"], max_outstanding=1))
        d = next(iter(call)).deliveries[0]
        stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True))
        call.cancel()  # type: ignore[no-untyped-call]
        IDS["leased"] = stub.Enqueue(E(queue="known", payload=b"l")).job_id
        call = stub.Consume(
            service_pb2.ConsumeRequest(
                queues=["known"], max_outstanding=1, lease_duration=ms(3_600_000)
            )
        )
        next(iter(call))
        IDS["scheduled"] = stub.Enqueue(E(queue="known", payload=b"s", delay=ms(3_600_000))).job_id
        IDS["deleted"] = stub.Enqueue(E(queue="known", payload=b"x", delay=ms(3_600_000))).job_id
        stub.Delete(service_pb2.DeleteRequest(queue="known", job_id=IDS["deleted"]))
        client = redis.Redis.from_url(r.url)
        yield admin_pb2_grpc.AdminServiceStub(ch), client
        call.cancel()  # type: ignore[no-untyped-call]
        client.close()


def _cases() -> list[tuple[str, str, Any, grpc.StatusCode, str]]:
    k = "known"
    return [
        # ListQueues
        ("list bad namespace", "ListQueues", A.ListQueuesRequest(namespace="a{b}"), INVALID, "namespace"),
        ("list page_size", "ListQueues", A.ListQueuesRequest(page_size=501), INVALID, "page_size"),
        ("list bad page token", "ListQueues", A.ListQueuesRequest(page_token="nonsense"), INVALID, "page_token"),
        # CreateQueue
        ("create no name", "CreateQueue", A.CreateQueueRequest(), INVALID, "queue"),
        ("create shards", "CreateQueue", A.CreateQueueRequest(queue="n", settings=A.QueueSettings(shards=2000)), INVALID, "settings.shards"),
        ("create lease", "CreateQueue", A.CreateQueueRequest(queue="n", settings=A.QueueSettings(default_lease=ms(10))), INVALID, "settings.default_lease"),
        ("create attempts", "CreateQueue", A.CreateQueueRequest(queue="n", settings=A.QueueSettings(max_attempts=1001)), INVALID, "settings.max_attempts"),
        ("create retry", "CreateQueue", A.CreateQueueRequest(queue="n", settings=A.QueueSettings(retry=job_pb2.RetryPolicy(multiplier=11))), INVALID, "settings.retry.multiplier"),
        ("create dead retention", "CreateQueue", A.CreateQueueRequest(queue="n", settings=A.QueueSettings(dead_retention=duration_pb2.Duration(seconds=-1))), INVALID, "settings.dead_retention"),
        ("create dead max", "CreateQueue", A.CreateQueueRequest(queue="n", settings=A.QueueSettings(dead_max_jobs=10**9)), INVALID, "settings.dead_max_jobs"),
        ("create existing", "CreateQueue", A.CreateQueueRequest(queue=k), EXISTS, "queue"),
        # GetQueue
        ("get unknown queue", "GetQueue", A.GetQueueRequest(queue="nope"), NOT_FOUND, "queue"),
        ("get bad queue", "GetQueue", A.GetQueueRequest(queue="a:b"), INVALID, "queue"),
        # UpdateQueue
        ("update no mask", "UpdateQueue", A.UpdateQueueRequest(queue=k), INVALID, "update_mask"),
        ("update shards", "UpdateQueue", A.UpdateQueueRequest(queue=k, update_mask=_mask("shards")), INVALID, "update_mask.paths[0]"),
        ("update unknown path", "UpdateQueue", A.UpdateQueueRequest(queue=k, update_mask=_mask("max_attempts", "colour")), INVALID, "update_mask.paths[1]"),
        ("update bad value", "UpdateQueue", A.UpdateQueueRequest(queue=k, settings=A.QueueSettings(max_attempts=5000), update_mask=_mask("max_attempts")), INVALID, "settings.max_attempts"),
        ("update unknown queue", "UpdateQueue", A.UpdateQueueRequest(queue="nope", update_mask=_mask("max_attempts")), NOT_FOUND, "queue"),
        # DeleteQueue
        ("delete unknown queue", "DeleteQueue", A.DeleteQueueRequest(queue="nope"), NOT_FOUND, "queue"),
        ("delete not empty", "DeleteQueue", A.DeleteQueueRequest(queue=k), FAILED, "queue"),
        # PauseQueue / ResumeQueue
        ("pause unknown queue", "PauseQueue", A.PauseQueueRequest(queue="nope"), NOT_FOUND, "queue"),
        ("pause bad namespace", "PauseQueue", A.PauseQueueRequest(namespace="x/y", queue=k), INVALID, "namespace"),
        ("resume unknown queue", "ResumeQueue", A.ResumeQueueRequest(queue="nope"), NOT_FOUND, "queue"),
        # PurgeQueue
        ("purge unknown queue", "PurgeQueue", A.PurgeQueueRequest(queue="nope"), NOT_FOUND, "queue"),
        ("purge bad state", "PurgeQueue", A.PurgeQueueRequest(queue=k, state=9), INVALID, "state"),  # type: ignore[arg-type]
        ("purge limit", "PurgeQueue", A.PurgeQueueRequest(queue=k, limit=10_001), INVALID, "limit"),
        # ListJobs
        ("jobs no state", "ListJobs", A.ListJobsRequest(queue=k), INVALID, "state"),
        ("jobs unknown queue", "ListJobs", A.ListJobsRequest(queue="nope", state=job_pb2.JOB_STATE_SCHEDULED), NOT_FOUND, "queue"),
        ("jobs bad page token", "ListJobs", A.ListJobsRequest(queue=k, state=job_pb2.JOB_STATE_SCHEDULED, page_token="1.0.0.x"), INVALID, "page_token"),
        ("jobs token of another state", "ListJobs", A.ListJobsRequest(queue=k, state=job_pb2.JOB_STATE_SCHEDULED, page_token="4.0.0.0"), INVALID, "page_token"),
        ("jobs token past the shards", "ListJobs", A.ListJobsRequest(queue=k, state=job_pb2.JOB_STATE_SCHEDULED, page_token="1.5.0.0"), INVALID, "page_token"),
        ("jobs empty range", "ListJobs", A.ListJobsRequest(queue=k, state=job_pb2.JOB_STATE_SCHEDULED, from_time=timestamp_pb2.Timestamp(seconds=20), to_time=timestamp_pb2.Timestamp(seconds=10)), INVALID, "to_time"),
        ("jobs preview", "ListJobs", A.ListJobsRequest(queue=k, state=job_pb2.JOB_STATE_SCHEDULED, payload_preview_bytes=70_000), INVALID, "payload_preview_bytes"),
        ("jobs page size", "ListJobs", A.ListJobsRequest(queue=k, state=job_pb2.JOB_STATE_SCHEDULED, page_size=501), INVALID, "page_size"),
        # RescheduleJob
        ("reschedule no time", "RescheduleJob", A.RescheduleJobRequest(queue=k, job_id=IDS.get("scheduled", GOOD_ID)), INVALID, "delay"),
        ("reschedule bad id", "RescheduleJob", A.RescheduleJobRequest(queue=k, job_id="zz", delay=ms(1)), INVALID, "job_id"),
        ("reschedule far", "RescheduleJob", A.RescheduleJobRequest(queue=k, job_id=GOOD_ID, delay=duration_pb2.Duration(seconds=400 * 86400)), INVALID, "delay"),
        ("reschedule unknown queue", "RescheduleJob", A.RescheduleJobRequest(queue="nope", job_id=GOOD_ID, delay=ms(1)), NOT_FOUND, "queue"),
        ("reschedule deleted job", "RescheduleJob", A.RescheduleJobRequest(queue=k, job_id=IDS.get("deleted", GOOD_ID), delay=ms(1)), NOT_FOUND, "job_id"),
        ("reschedule leased", "RescheduleJob", A.RescheduleJobRequest(queue=k, job_id=IDS.get("leased", GOOD_ID), delay=ms(1)), FAILED, "force"),
        ("reschedule dead", "RescheduleJob", A.RescheduleJobRequest(queue=k, job_id=IDS.get("dead", GOOD_ID), delay=ms(1)), FAILED, "job_id"),
        # UpdateJob
        ("update job no mask", "UpdateJob", A.UpdateJobRequest(queue=k, job_id=IDS.get("scheduled", GOOD_ID)), INVALID, "update_mask"),
        ("update job empty payload", "UpdateJob", A.UpdateJobRequest(queue=k, job_id=IDS.get("scheduled", GOOD_ID), update_mask=_mask("payload")), INVALID, "payload"),
        ("update job big payload", "UpdateJob", A.UpdateJobRequest(queue=k, job_id=IDS.get("scheduled", GOOD_ID), payload=b"x" * (256 * 1024 + 1), update_mask=_mask("payload")), INVALID, "payload"),
        ("update job deleted", "UpdateJob", A.UpdateJobRequest(queue=k, job_id=IDS.get("deleted", GOOD_ID), payload=b"p", update_mask=_mask("payload")), NOT_FOUND, "job_id"),
        ("update job leased", "UpdateJob", A.UpdateJobRequest(queue=k, job_id=IDS.get("leased", GOOD_ID), payload=b"p", update_mask=_mask("payload")), FAILED, "job_id"),
        # RedriveDeadLetters
        ("redrive unknown queue", "RedriveDeadLetters", A.RedriveDeadLettersRequest(queue="nope"), NOT_FOUND, "queue"),
        ("redrive unknown target", "RedriveDeadLetters", A.RedriveDeadLettersRequest(queue=k, target_queue="nope"), NOT_FOUND, "target_queue"),
        ("redrive bad target", "RedriveDeadLetters", A.RedriveDeadLettersRequest(queue=k, target_queue="a}b"), INVALID, "target_queue"),
        ("redrive bad id", "RedriveDeadLetters", A.RedriveDeadLettersRequest(queue=k, job_ids=[GOOD_ID, "bad"]), INVALID, "job_ids[1]"),
        ("redrive limit", "RedriveDeadLetters", A.RedriveDeadLettersRequest(queue=k, limit=10_001), INVALID, "limit"),
        ("redrive rate", "RedriveDeadLetters", A.RedriveDeadLettersRequest(queue=k, rate=100_001), INVALID, "rate"),
    ]  # fmt: skip


# Ids are known once the fixture ran: cases are built inside the test.
NAMES = [c[0] for c in _cases()]


@pytest.mark.parametrize("name", NAMES)
def test_admin_refusal(
    isolated: tuple[admin_pb2_grpc.AdminServiceStub, redis.Redis], name: str
) -> None:
    admin, client = isolated
    (_, rpc, req, code, field), *_ = [c for c in _cases() if c[0] == name]
    before = redis_digest(client)
    with pytest.raises(grpc.RpcError) as exc:
        getattr(admin, rpc)(req, timeout=10)
    assert exc.value.code() == code, exc.value.details()
    assert (exc.value.details() or "").startswith(field + ":"), exc.value.details()
    assert redis_digest(client) == before, f"{rpc} refusal changed Redis"


def test_roles_and_namespaces(auth_srv: AuthServer) -> None:
    """Reads need the read role; changes need admin, in the token's own namespace."""
    ns = "adm14"
    owner = auth_srv.admin(auth_srv.token(ns, "admin"))
    owner.CreateQueue(A.CreateQueueRequest(namespace=ns, queue="q"), timeout=10)
    reader = auth_srv.admin(auth_srv.token(ns, "read"))
    assert (
        reader.GetQueue(A.GetQueueRequest(namespace=ns, queue="q"), timeout=10).queue.queue == "q"
    )
    listed = reader.ListQueues(A.ListQueuesRequest(), timeout=10).queues
    assert {(x.namespace, x.queue) for x in listed} == {(ns, "q")}
    changes: list[tuple[str, Any]] = [
        ("PauseQueue", A.PauseQueueRequest(namespace=ns, queue="q")),
        ("ResumeQueue", A.ResumeQueueRequest(namespace=ns, queue="q")),
        ("PurgeQueue", A.PurgeQueueRequest(namespace=ns, queue="q")),
        ("DeleteQueue", A.DeleteQueueRequest(namespace=ns, queue="q")),
        ("CreateQueue", A.CreateQueueRequest(namespace=ns, queue="q2")),
        ("UpdateQueue", A.UpdateQueueRequest(namespace=ns, queue="q", update_mask=_mask("max_attempts"))),
        ("RescheduleJob", A.RescheduleJobRequest(namespace=ns, queue="q", job_id=GOOD_ID, delay=ms(1))),
        ("UpdateJob", A.UpdateJobRequest(namespace=ns, queue="q", job_id=GOOD_ID)),
        ("RedriveDeadLetters", A.RedriveDeadLettersRequest(namespace=ns, queue="q")),
    ]  # fmt: skip
    before = redis_digest(redis.Redis.from_url(auth_srv.redis.url))
    for rpc, req in changes:
        with pytest.raises(grpc.RpcError) as exc:
            getattr(reader, rpc)(req, timeout=10)
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED, rpc
    # An admin of another namespace reaches nothing here, reads included.
    stranger = auth_srv.admin(auth_srv.token("other14", "admin", "read"))
    before = redis_digest(redis.Redis.from_url(auth_srv.redis.url))
    for rpc, req in [*changes, ("GetQueue", A.GetQueueRequest(namespace=ns, queue="q"))]:
        with pytest.raises(grpc.RpcError) as exc:
            getattr(stranger, rpc)(req, timeout=10)
        assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED, rpc
    assert redis_digest(redis.Redis.from_url(auth_srv.redis.url)) == before
    assert stranger.ListQueues(A.ListQueuesRequest(), timeout=10).queues == []
    # No token at all: UNAUTHENTICATED.
    with pytest.raises(grpc.RpcError) as exc:
        admin_pb2_grpc.AdminServiceStub(auth_srv.channel(None)).ListQueues(
            A.ListQueuesRequest(), timeout=10
        )
    assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
