"""Auth over real gRPC: every role, every refusal, and the cross-tenant attacks of issue 9."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from delayq.v1 import job_pb2, service_pb2
from tests.support.auth import AuthServer
from tests.support.rpc import Stub, ms

_ns = itertools.count()


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> str:
    """A namespace of this test alone (the auth server is shared by the session)."""
    return f"t{next(_ns)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")


def code_of(fn: object, *args: object, **kw: object) -> grpc.StatusCode:
    assert callable(fn)
    with pytest.raises(grpc.RpcError) as info:
        fn(*args, timeout=10, **kw)
    return info.value.code()


def enqueue(stub: Stub, ns: str, queue: str = "q", **kw: object) -> str:
    req = service_pb2.EnqueueRequest(namespace=ns, queue=queue, payload=b"secret", **kw)  # type: ignore[arg-type]
    return stub.Enqueue(req, timeout=10).job_id


def leases(stub: Stub, ns: str, n: int, queue: str = "q") -> list[job_pb2.Delivery]:
    """Opens a Consume stream, takes n deliveries and leaves the stream open."""
    call = stub.Consume(
        service_pb2.ConsumeRequest(
            namespace=ns, queues=[queue], max_outstanding=n, lease_duration=ms(60_000)
        ),
        timeout=30,
    )
    _streams.append(call)
    got: list[job_pb2.Delivery] = []
    for resp in call:
        got.extend(resp.deliveries)
        if len(got) >= n:
            break
    return got


def lease(stub: Stub, ns: str, queue: str = "q") -> job_pb2.Delivery:
    """Opens a Consume stream, takes one delivery and leaves the stream open."""
    return leases(stub, ns, 1, queue)[0]


_streams: list[Any] = []  # open Consume calls, cancelled after each test


@pytest.fixture(autouse=True)
def _close_streams() -> Iterator[None]:
    yield
    while _streams:
        _streams.pop().cancel()


# -- authentication ------------------------------------------------------------------------


def test_missing_malformed_and_unknown_tokens_are_unauthenticated(
    auth_srv: AuthServer, ns: str
) -> None:
    req = service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x")
    assert code_of(auth_srv.stub(None).Enqueue, req) == grpc.StatusCode.UNAUTHENTICATED
    forged = "dq_0123456789abcdef_" + "A" * 43
    assert code_of(auth_srv.stub(forged).Enqueue, req) == grpc.StatusCode.UNAUTHENTICATED
    assert code_of(auth_srv.stub("nonsense").Enqueue, req) == grpc.StatusCode.UNAUTHENTICATED
    ch = auth_srv.channel(None)
    basic = service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x")
    with pytest.raises(grpc.RpcError) as info:
        Stub(ch).Enqueue(basic, timeout=10, metadata=(("authorization", "Basic abc"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # A real token's id with another secret: the hash comparison refuses it.
    good = auth_srv.token(ns, "produce")
    wrong_secret = good[:-1] + ("A" if good[-1] != "A" else "B")
    assert code_of(auth_srv.stub(wrong_secret).Enqueue, req) == grpc.StatusCode.UNAUTHENTICATED


def test_anonymous_flood_creates_no_namespace(auth_srv: AuthServer, ns: str) -> None:
    r = redis.Redis.from_url(auth_srv.redis.url)
    before = set(r.scan_iter(match=f"*{ns}*"))
    for _ in range(5):
        req = service_pb2.EnqueueRequest(namespace=ns, queue="flood", payload=b"x")
        assert code_of(auth_srv.stub(None).Enqueue, req) == grpc.StatusCode.UNAUTHENTICATED
    assert set(r.scan_iter(match=f"*{ns}*")) == before == set()
    assert not r.sismember("dq:queues", f"{ns}/flood")
    r.close()


def test_health_and_reflection_stay_open(auth_srv: AuthServer) -> None:
    ch = auth_srv.channel(None)
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
    services = set(ProtoReflectionDescriptorDatabase(ch).get_services())
    assert {"delayq.v1.DelayQueueService", "delayq.v1.AdminService"} <= services


# -- roles ---------------------------------------------------------------------------------


def test_produce_role_enqueues_and_nothing_else(auth_srv: AuthServer, ns: str) -> None:
    stub = auth_srv.stub(auth_srv.token(ns, "produce"))
    job_id = enqueue(stub, ns)
    batch = service_pb2.EnqueueBatchRequest(
        requests=[service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"b")]
    )
    assert stub.EnqueueBatch(batch, timeout=10).results[0].response.job_id
    denied = grpc.StatusCode.PERMISSION_DENIED
    assert (
        code_of(stub.Query, service_pb2.QueryRequest(namespace=ns, queue="q", job_id=job_id))
        == denied
    )
    assert (
        code_of(stub.GetQueueStats, service_pb2.GetQueueStatsRequest(namespace=ns, queue="q"))
        == denied
    )
    assert (
        code_of(stub.Delete, service_pb2.DeleteRequest(namespace=ns, queue="q", job_id=job_id))
        == denied
    )
    call = stub.Consume(service_pb2.ConsumeRequest(namespace=ns, queues=["q"], max_outstanding=1))
    with pytest.raises(grpc.RpcError) as info:
        next(iter(call))
    assert info.value.code() == denied


def test_consume_role_leases_acks_nacks_and_extends(auth_srv: AuthServer, ns: str) -> None:
    producer = auth_srv.stub(auth_srv.token(ns, "produce"))
    worker = auth_srv.stub(auth_srv.token(ns, "consume"))
    for _ in range(2):
        enqueue(producer, ns)
    enqueue(producer, ns)
    d1, d2, d3 = leases(worker, ns, 3)
    rel = worker.Release(service_pb2.ReleaseRequest(lease_tokens=[d3.lease_token]), timeout=10)
    assert list(rel.results) == [service_pb2.RELEASE_RESULT_RELEASED]
    ext = service_pb2.ExtendLeaseRequest(lease_token=d1.lease_token, extension=ms(5_000))
    assert worker.ExtendLease(ext, timeout=10).lease_deadline.seconds > 0
    acked = worker.Ack(service_pb2.AckRequest(lease_tokens=[d1.lease_token]), timeout=10)
    assert list(acked.results) == [service_pb2.ACK_RESULT_ACKED]
    nack = service_pb2.NackRequest(lease_token=d2.lease_token, dead_letter=True)
    assert worker.Nack(nack, timeout=10).state == job_pb2.JOB_STATE_DEAD
    req = service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x")
    assert code_of(worker.Enqueue, req) == grpc.StatusCode.PERMISSION_DENIED
    dead = service_pb2.ListDeadJobsRequest(namespace=ns, queue="q")
    assert code_of(worker.ListDeadJobs, dead) == grpc.StatusCode.PERMISSION_DENIED


def test_read_role_reads_and_admin_role_administers(auth_srv: AuthServer, ns: str) -> None:
    producer = auth_srv.stub(auth_srv.token(ns, "produce"))
    reader = auth_srv.stub(auth_srv.token(ns, "read"))
    admin = auth_srv.stub(auth_srv.token(ns, "admin"))
    job_id = enqueue(producer, ns)
    q = service_pb2.QueryRequest(namespace=ns, queue="q", job_id=job_id)
    assert reader.Query(q, timeout=10).job.id == job_id
    stats = reader.GetQueueStats(
        service_pb2.GetQueueStatsRequest(namespace=ns, queue="q"), timeout=10
    )
    assert stats.stats.ready == 1
    assert not reader.ListDeadJobs(
        service_pb2.ListDeadJobsRequest(namespace=ns, queue="q"), timeout=10
    ).jobs
    delete = service_pb2.DeleteRequest(namespace=ns, queue="q", job_id=job_id)
    assert code_of(reader.Delete, delete) == grpc.StatusCode.PERMISSION_DENIED
    redrive = service_pb2.RedriveDeadJobsRequest(namespace=ns, queue="q")
    assert code_of(reader.RedriveDeadJobs, redrive) == grpc.StatusCode.PERMISSION_DENIED
    assert admin.Delete(delete, timeout=10).previous_state == job_pb2.JOB_STATE_READY
    assert admin.RedriveDeadJobs(redrive, timeout=10).redriven == 0
    purge = service_pb2.PurgeDeadJobsRequest(namespace=ns, queue="q")
    assert admin.PurgeDeadJobs(purge, timeout=10).purged == 0


def test_all_namespace_token_reaches_every_namespace(auth_srv: AuthServer, ns: str) -> None:
    stub = auth_srv.stub(auth_srv.token("*", "produce"))
    assert enqueue(stub, ns + "-a") and enqueue(stub, ns + "-b")


# -- tenants -------------------------------------------------------------------------------


def test_cross_tenant_attacks_of_issue_9_are_refused(auth_srv: AuthServer, ns: str) -> None:
    """Tenant B, with every role in its own namespace, attacks tenant A's queue."""
    a, b = ns + "-a", ns + "-b"
    owner = auth_srv.stub(auth_srv.token(a, "produce", "consume", "read", "admin"))
    attacker = auth_srv.stub(auth_srv.token(b, "produce", "consume", "read", "admin"))
    job_id = enqueue(owner, a)
    other_id = enqueue(owner, a)
    denied, missing = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND
    # Naming tenant A's namespace is refused outright ...
    assert (
        code_of(attacker.Query, service_pb2.QueryRequest(namespace=a, queue="q", job_id=job_id))
        == denied
    )
    assert (
        code_of(attacker.Delete, service_pb2.DeleteRequest(namespace=a, queue="q", job_id=job_id))
        == denied
    )
    assert (
        code_of(attacker.GetQueueStats, service_pb2.GetQueueStatsRequest(namespace=a, queue="q"))
        == denied
    )
    assert (
        code_of(attacker.ListDeadJobs, service_pb2.ListDeadJobsRequest(namespace=a, queue="q"))
        == denied
    )
    assert (
        code_of(
            attacker.RedriveDeadJobs, service_pb2.RedriveDeadJobsRequest(namespace=a, queue="q")
        )
        == denied
    )
    assert (
        code_of(attacker.PurgeDeadJobs, service_pb2.PurgeDeadJobsRequest(namespace=a, queue="q"))
        == denied
    )
    assert (
        code_of(attacker.Enqueue, service_pb2.EnqueueRequest(namespace=a, queue="q", payload=b"x"))
        == denied
    )
    mixed = service_pb2.EnqueueBatchRequest(
        requests=[
            service_pb2.EnqueueRequest(namespace=b, queue="q", payload=b"x"),
            service_pb2.EnqueueRequest(namespace=a, queue="q", payload=b"x"),
        ]
    )
    assert code_of(attacker.EnqueueBatch, mixed) == denied
    call = attacker.Consume(
        service_pb2.ConsumeRequest(namespace=a, queues=["q"], max_outstanding=1)
    )
    with pytest.raises(grpc.RpcError) as info:
        next(iter(call))
    assert info.value.code() == denied
    # ... and A's job id under B's own namespace is just not there.
    assert (
        code_of(attacker.Query, service_pb2.QueryRequest(namespace=b, queue="q", job_id=job_id))
        == missing
    )
    assert (
        code_of(attacker.Delete, service_pb2.DeleteRequest(namespace=b, queue="q", job_id=job_id))
        == missing
    )
    # A's lease token answers as an unknown one: UNKNOWN for Ack, NOT_FOUND otherwise.
    d = lease(owner, a)
    acked = attacker.Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]), timeout=10)
    assert list(acked.results) == [service_pb2.ACK_RESULT_UNKNOWN]
    released = attacker.Release(
        service_pb2.ReleaseRequest(lease_tokens=[d.lease_token]), timeout=10
    )
    assert list(released.results) == [service_pb2.RELEASE_RESULT_UNKNOWN]
    nack = service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True)
    assert code_of(attacker.Nack, nack) == missing
    ext = service_pb2.ExtendLeaseRequest(lease_token=d.lease_token, extension=ms(5_000))
    assert code_of(attacker.ExtendLease, ext) == missing
    # Nothing of A changed: the job is still leased, the other still ready, and
    # the owner's ack goes through.
    q = service_pb2.QueryRequest(namespace=a, queue="q", job_id=d.job.id)
    assert owner.Query(q, timeout=10).job.state == job_pb2.JOB_STATE_LEASED
    q2 = service_pb2.QueryRequest(namespace=a, queue="q", job_id=other_id)
    assert owner.Query(q2, timeout=10).job.state == job_pb2.JOB_STATE_READY
    mine = enqueue(attacker, b)
    mine_d = lease(attacker, b)
    assert mine_d.job.id == mine
    both = attacker.Ack(
        service_pb2.AckRequest(lease_tokens=[d.lease_token, mine_d.lease_token]), timeout=10
    )
    assert list(both.results) == [service_pb2.ACK_RESULT_UNKNOWN, service_pb2.ACK_RESULT_ACKED]
    owned = owner.Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]), timeout=10)
    assert list(owned.results) == [service_pb2.ACK_RESULT_ACKED]


def _stream(stub: Stub, *batches: service_pb2.EnqueueStreamRequest) -> list[Any]:
    return list(stub.EnqueueStream(iter(batches), timeout=10))


def test_enqueue_stream_checks_credentials_at_open_and_namespaces_per_batch(
    auth_srv: AuthServer, ns: str
) -> None:
    other = ns + "-b"
    r = redis.Redis.from_url(auth_srv.redis.url)
    one = service_pb2.EnqueueStreamRequest(
        batch_id=1, requests=[service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x")]
    )
    for token, code in (
        (None, grpc.StatusCode.UNAUTHENTICATED),
        ("nonsense", grpc.StatusCode.UNAUTHENTICATED),
        (auth_srv.token(ns, "consume", "read", "admin"), grpc.StatusCode.PERMISSION_DENIED),
    ):
        with pytest.raises(grpc.RpcError) as info:
            _stream(auth_srv.stub(token), one)
        assert info.value.code() == code
    assert not list(r.scan_iter(match=f"*{ns}*"))
    # A produce token of `ns`: a batch naming another namespace is refused on its own,
    # nothing of it stored, and the stream goes on with the caller's own batch.
    producer = auth_srv.stub(auth_srv.token(ns, "produce"))
    mixed = service_pb2.EnqueueStreamRequest(
        batch_id=2,
        requests=[
            service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x"),
            service_pb2.EnqueueRequest(namespace=other, queue="q", payload=b"x"),
        ],
    )
    refused, stored = sorted(_stream(producer, mixed, one), key=lambda a: -a.batch_id)
    assert (
        refused.batch_id == 2 and refused.error.code == grpc.StatusCode.PERMISSION_DENIED.value[0]
    )
    assert refused.error.message.startswith("namespace: ")
    assert stored.batch_id == 1 and stored.results[0].response.job_id
    assert not list(r.scan_iter(match=f"*{other}*"))
    assert len(list(r.scan_iter(match=f"*{ns}/q*"))) > 0
    r.close()


def test_lease_token_with_a_flipped_character_or_forged_is_refused(
    auth_srv: AuthServer, ns: str
) -> None:
    owner = auth_srv.stub(auth_srv.token(ns, "produce", "consume", "read"))
    enqueue(owner, ns)
    other = enqueue(owner, ns)
    d = lease(owner, ns)
    t = d.lease_token
    flipped = t[:-1] + ("0" if t[-1] != "0" else "1")
    # The same nonce pointed at another job of the queue.
    forged = t.replace(d.job.id, other)
    res = owner.Ack(service_pb2.AckRequest(lease_tokens=[flipped, forged]), timeout=10)
    assert service_pb2.ACK_RESULT_ACKED not in res.results
    q = service_pb2.QueryRequest(namespace=ns, queue="q", job_id=d.job.id)
    assert owner.Query(q, timeout=10).job.state == job_pb2.JOB_STATE_LEASED
    q2 = service_pb2.QueryRequest(namespace=ns, queue="q", job_id=other)
    assert owner.Query(q2, timeout=10).job.state == job_pb2.JOB_STATE_READY
