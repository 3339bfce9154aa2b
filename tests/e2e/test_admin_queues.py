"""Queue administration over AdminService (issue 14): create, settings, pause, purge, delete."""

from __future__ import annotations

import time

import grpc
import pytest
import redis
from google.protobuf import field_mask_pb2

from delayq.v1 import admin_pb2, admin_pb2_grpc, job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, enqueue, ms, query
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until

A = admin_pb2


@pytest.fixture
def admin(channel: grpc.Channel) -> admin_pb2_grpc.AdminServiceStub:
    return admin_pb2_grpc.AdminServiceStub(channel)


def _create(admin: admin_pb2_grpc.AdminServiceStub, queue: str, **settings: object) -> A.Queue:
    req = A.CreateQueueRequest(queue=queue, settings=A.QueueSettings(**settings))  # type: ignore[arg-type]
    return admin.CreateQueue(req, timeout=10).queue


def test_create_get_list_and_settings_apply(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    q = _create(
        admin,
        queue,
        shards=2,
        max_attempts=7,
        default_lease=ms(5000),
        retry=job_pb2.RetryPolicy(initial_backoff=ms(2000), max_backoff=ms(9000), multiplier=3),
        dead_max_jobs=10,
    )
    assert (q.queue, q.settings.shards, q.settings.max_attempts) == (queue, 2, 7)
    assert q.settings.default_lease.seconds == 5
    assert q.stats.shards == 2 and not q.paused
    with pytest.raises(grpc.RpcError) as exc:
        _create(admin, queue)
    assert exc.value.code() == grpc.StatusCode.ALREADY_EXISTS

    got = admin.GetQueue(A.GetQueueRequest(queue=queue), timeout=10).queue
    assert got.settings == q.settings
    listed = admin.ListQueues(A.ListQueuesRequest(namespace="default"), timeout=10).queues
    assert queue in [x.queue for x in listed]

    # An Enqueue without max_attempts or retry takes the queue's settings ...
    job = query(stub, queue, enqueue(stub, queue))
    assert job.max_attempts == 7
    assert job.retry.initial_backoff.seconds == 2 and job.retry.multiplier == 3
    # ... one that gives them keeps its own.
    job = query(stub, queue, enqueue(stub, queue, max_attempts=2))
    assert job.max_attempts == 2
    # A Consume without lease_duration gets the queue's default lease.
    req = service_pb2.ConsumeRequest(queues=[queue], max_outstanding=10)
    call = stub.Consume(req)
    try:
        d = next(iter(call)).deliveries[0]
        lease_s = d.lease_deadline.seconds - d.job.last_delivery_time.seconds
        assert 4 <= lease_s <= 6, lease_s
    finally:
        call.cancel()  # type: ignore[no-untyped-call]


def test_update_changes_named_settings_only(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    _create(admin, queue, max_attempts=4, dead_max_jobs=5)
    upd = admin.UpdateQueue(
        A.UpdateQueueRequest(
            queue=queue,
            settings=A.QueueSettings(max_attempts=9),
            update_mask=field_mask_pb2.FieldMask(paths=["max_attempts"]),
        ),
        timeout=10,
    ).queue
    assert upd.settings.max_attempts == 9 and upd.settings.dead_max_jobs == 5
    # The replica's cached settings were dropped: the next job takes the new value.
    assert query(stub, queue, enqueue(stub, queue)).max_attempts == 9
    # A named field left unset goes back to the server default.
    upd = admin.UpdateQueue(
        A.UpdateQueueRequest(
            queue=queue, update_mask=field_mask_pb2.FieldMask(paths=["dead_max_jobs"])
        ),
        timeout=10,
    ).queue
    assert upd.settings.dead_max_jobs == 0 and upd.settings.max_attempts == 9


def test_pause_skips_the_queue_resume_delivers(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    paused, other = f"{queue}-p", f"{queue}-o"
    held = enqueue(stub, paused, b"leased before the pause")
    with Consumer(stub, [paused], max_outstanding=1) as c:
        (lease,) = c.take(1)
        assert lease.job.id == held
        q = admin.PauseQueue(A.PauseQueueRequest(queue=paused), timeout=10).queue
        assert q.paused
        # The lease in flight is untouched: its Ack still completes the job.
        acked = stub.Ack(service_pb2.AckRequest(lease_tokens=[lease.lease_token]), timeout=10)
        assert list(acked.results) == [service_pb2.ACK_RESULT_ACKED]
    # Enqueue is still accepted while paused.
    waiting = enqueue(stub, paused, b"waits")
    enqueue(stub, other, b"flows")
    # The stream prefers `paused` (listed first) yet gets `other`'s job: the
    # paused queue was skipped, and its job stays ready.
    with Consumer(stub, [paused, other], max_outstanding=10) as c:
        (d,) = c.take(1)
        assert d.job.queue == other
        assert query(stub, paused, waiting).state == job_pb2.JOB_STATE_READY
        listed = admin.ListQueues(A.ListQueuesRequest(namespace="default"), timeout=10).queues
        assert [x.paused for x in listed if x.queue == paused] == [True]
        resumed = admin.ResumeQueue(A.ResumeQueueRequest(queue=paused), timeout=10).queue
        assert not resumed.paused
        (d,) = c.take(1)
        assert (d.job.queue, d.job.id) == (paused, waiting)


def test_purge_in_bounded_steps_then_delete(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str, redis_server: ManagedRedis
) -> None:
    reqs = [
        service_pb2.EnqueueRequest(queue=queue, payload=b"x", delay=ms(3_600_000))
        for _ in range(1000)
    ]
    for start in range(0, 1000, 500):
        stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs[start : start + 500]))
    enqueue(stub, queue, b"ready now")
    with pytest.raises(grpc.RpcError) as exc:
        admin.DeleteQueue(A.DeleteQueueRequest(queue=queue), timeout=10)
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not empty" in (exc.value.details() or "")

    step = admin.PurgeQueue(
        A.PurgeQueueRequest(queue=queue, state=job_pb2.JOB_STATE_SCHEDULED, limit=400), timeout=10
    )
    assert (step.purged, step.remaining) == (400, 600)
    progress = [step.remaining]
    while progress[-1]:
        step = admin.PurgeQueue(A.PurgeQueueRequest(queue=queue, limit=400), timeout=10)
        progress.append(step.remaining)
    assert progress == [600, 201, 0]  # every state: the ready job counts too
    admin.DeleteQueue(A.DeleteQueueRequest(queue=queue), timeout=10)
    with pytest.raises(grpc.RpcError) as exc:
        admin.GetQueue(A.GetQueueRequest(queue=queue), timeout=10)
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    listed = admin.ListQueues(A.ListQueuesRequest(namespace="default"), timeout=10).queues
    assert queue not in [x.queue for x in listed]
    r = redis.Redis.from_url(redis_server.url)
    try:
        # Left: liveness (owner) and replay keys, which expire by themselves.
        keys = r.scan_iter(match=f"dq:{{default/{queue}*")
        assert [k for k in keys if not k.endswith(b":owner") and b":rq:" not in k] == []
    finally:
        r.close()


def test_delete_stops_timers_on_every_replica(redis_server: ManagedRedis, queue: str) -> None:
    """Timer ownership leases of a deleted queue are renewed by no replica."""
    with (
        DelayqProcess(redis_server.url) as a,
        DelayqProcess(redis_server.url) as b,
        a.channel() as ch_a,
        b.channel() as ch_b,
    ):
        enqueue(a.stub(ch_a), queue, b"x")
        enqueue(b.stub(ch_b), queue, b"y")  # both replicas run the queue's loops
        r = redis.Redis.from_url(redis_server.url)
        try:
            owner = f"dq:{{default/{queue}/0}}:owner"
            wait_until(lambda: r.exists(owner), timeout=20)
            adm = admin_pb2_grpc.AdminServiceStub(ch_a)
            adm.PurgeQueue(A.PurgeQueueRequest(queue=queue), timeout=10)
            adm.DeleteQueue(A.DeleteQueueRequest(queue=queue), timeout=10)
            # The owner lease (3 s) runs out and nobody takes it again.
            wait_until(lambda: not r.exists(owner), timeout=30)
            deadline = time.monotonic() + 5  # a renewal would come within 1 s
            while time.monotonic() < deadline:
                assert not r.exists(owner)
                time.sleep(0.2)
        finally:
            r.close()


def test_dead_retention_by_count_is_enforced_by_the_janitor(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    _create(admin, queue, max_attempts=1)
    ids = [enqueue(stub, queue, f"j{i}".encode()) for i in range(5)]
    with Consumer(stub, [queue], max_outstanding=5) as c:
        for d in c.take(5):
            stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True))
    assert admin.GetQueue(A.GetQueueRequest(queue=queue), timeout=10).queue.stats.dead == 5
    admin.UpdateQueue(
        A.UpdateQueueRequest(
            queue=queue,
            settings=A.QueueSettings(dead_max_jobs=2),
            update_mask=field_mask_pb2.FieldMask(paths=["dead_max_jobs"]),
        ),
        timeout=10,
    )

    def dead() -> int:
        return admin.GetQueue(A.GetQueueRequest(queue=queue), timeout=10).queue.stats.dead

    wait_until(lambda: dead() == 2, timeout=30)
    listed = admin.ListJobs(
        A.ListJobsRequest(queue=queue, state=job_pb2.JOB_STATE_DEAD), timeout=10
    ).jobs
    assert {j.id for j in listed} <= set(ids) and len(listed) == 2


def test_dead_retention_by_age_and_completed_retention_per_queue(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    # The server keeps completed jobs 60 s (SERVER_ARGS); this queue keeps none,
    # and deletes dead jobs 1 s after their death.
    _create(admin, queue, max_attempts=1, completed_retention=ms(0), dead_retention=ms(1000))
    done, dead = enqueue(stub, queue, b"done"), enqueue(stub, queue, b"dead")
    with Consumer(stub, [queue], max_outstanding=2) as c:
        for d in c.take(2):
            if d.job.id == done:
                stub.Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]), timeout=10)
            else:
                stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True))
    with pytest.raises(grpc.RpcError) as exc:
        query(stub, queue, done)  # not retained: gone at once
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND

    def gone() -> bool:
        try:
            query(stub, queue, dead)
        except grpc.RpcError as e:
            return e.code() == grpc.StatusCode.NOT_FOUND
        return False

    wait_until(gone, timeout=30)  # the janitor's next pass comes when the job ages out
