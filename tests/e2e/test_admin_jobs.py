"""Job administration over AdminService (issue 14): list, reschedule, update, redrive."""

from __future__ import annotations

import time

import grpc
import pytest
from google.protobuf import field_mask_pb2

from delayq.v1 import admin_pb2, admin_pb2_grpc, job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, enqueue, in_seconds, ms, query

A = admin_pb2
SCHEDULED, READY, LEASED, DEAD = (
    job_pb2.JOB_STATE_SCHEDULED,
    job_pb2.JOB_STATE_READY,
    job_pb2.JOB_STATE_LEASED,
    job_pb2.JOB_STATE_DEAD,
)


@pytest.fixture
def admin(channel: grpc.Channel) -> admin_pb2_grpc.AdminServiceStub:
    return admin_pb2_grpc.AdminServiceStub(channel)


def _dead(stub: Stub, queue: str, n: int) -> list[str]:
    ids = [enqueue(stub, queue, f"dead {i}".encode()) for i in range(n)]
    with Consumer(stub, [queue], max_outstanding=n) as c:
        for d in c.take(n):
            stub.Nack(
                service_pb2.NackRequest(lease_token=d.lease_token, dead_letter=True, reason="x"),
                timeout=10,
            )
    return ids


def test_list_scheduled_by_due_time_with_range_and_paging(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    ids = [enqueue(stub, queue, b"p" * 1000, delay=ms(60_000 * (i + 1))) for i in range(7)]
    seen: list[str] = []
    token = ""
    while True:
        resp = admin.ListJobs(
            A.ListJobsRequest(
                queue=queue, state=SCHEDULED, page_size=2, page_token=token,
                payload_preview_bytes=10,
            ),
            timeout=10,
        )  # fmt: skip
        assert all(j.payload == b"p" * 10 for j in resp.jobs)
        seen += [j.id for j in resp.jobs]
        token = resp.next_page_token
        if not token:
            break
    assert seen == ids  # due order
    # A range: due from 2.5 to 5.5 minutes from now holds jobs 3, 4, 5.
    now = time.time()
    req = A.ListJobsRequest(queue=queue, state=SCHEDULED)
    req.from_time.FromMilliseconds(int((now + 150) * 1000))
    req.to_time.FromMilliseconds(int((now + 330) * 1000))
    assert [j.id for j in admin.ListJobs(req, timeout=10).jobs] == ids[2:5]


def test_list_ready_and_dead(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    ready = [enqueue(stub, queue, f"r{i}".encode()) for i in range(3)]
    listed = admin.ListJobs(A.ListJobsRequest(queue=queue, state=READY), timeout=10).jobs
    assert [j.id for j in listed] == ready  # oldest first
    dead_q = f"{queue}-d"
    dead = _dead(stub, dead_q, 3)
    listed = admin.ListJobs(A.ListJobsRequest(queue=dead_q, state=DEAD), timeout=10).jobs
    assert sorted(j.id for j in listed) == sorted(dead)
    assert all(j.state == DEAD and j.last_error == "x" for j in listed)


def test_reschedule_keeps_the_id_and_moves_the_due_time(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue, b"later", delay=ms(3_600_000))
    resp = admin.RescheduleJob(
        A.RescheduleJobRequest(queue=queue, job_id=job_id, due_time=in_seconds(7200)), timeout=10
    )
    assert resp.job.id == job_id and resp.job.state == SCHEDULED
    assert abs(resp.job.due_time.seconds - in_seconds(7200).seconds) <= 2
    # Brought forward to now: ready at once and delivered, attempts untouched.
    resp = admin.RescheduleJob(
        A.RescheduleJobRequest(queue=queue, job_id=job_id, delay=ms(0)), timeout=10
    )
    assert resp.job.state == READY
    with Consumer(stub, [queue]) as c:
        (d,) = c.take(1)
        assert (d.job.id, d.attempt) == (job_id, 1)
        # Leased: refused without force ...
        with pytest.raises(grpc.RpcError) as exc:
            admin.RescheduleJob(
                A.RescheduleJobRequest(queue=queue, job_id=job_id, delay=ms(60_000)), timeout=10
            )
        assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (exc.value.details() or "").startswith("force:")
        # ... taken back with force: the holder's token is stale, the attempt counted.
        resp = admin.RescheduleJob(
            A.RescheduleJobRequest(queue=queue, job_id=job_id, delay=ms(60_000), force=True),
            timeout=10,
        )
        assert resp.job.state == SCHEDULED and resp.job.attempts == 1
        acked = stub.Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]), timeout=10)
        assert list(acked.results) == [service_pb2.ACK_RESULT_STALE]


def test_reschedule_of_a_deleted_or_dead_job_is_refused(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue, delay=ms(60_000))
    stub.Delete(service_pb2.DeleteRequest(queue=queue, job_id=job_id), timeout=10)
    with pytest.raises(grpc.RpcError) as exc:
        admin.RescheduleJob(
            A.RescheduleJobRequest(queue=queue, job_id=job_id, delay=ms(1000)), timeout=10
        )
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert (exc.value.details() or "").startswith("job_id:")
    (dead,) = _dead(stub, queue, 1)
    with pytest.raises(grpc.RpcError) as exc:
        admin.RescheduleJob(
            A.RescheduleJobRequest(queue=queue, job_id=dead, delay=ms(1000)), timeout=10
        )
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    ttl_job = enqueue(stub, queue, delay=ms(1000), ttl=ms(60_000))
    with pytest.raises(grpc.RpcError) as exc:
        admin.RescheduleJob(
            A.RescheduleJobRequest(queue=queue, job_id=ttl_job, delay=ms(120_000)), timeout=10
        )
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert query(stub, queue, ttl_job).state == SCHEDULED


def test_update_job_payload_and_headers(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    job_id = enqueue(stub, queue, b"old", delay=ms(60_000), headers={"a": "1"})
    resp = admin.UpdateJob(
        A.UpdateJobRequest(
            queue=queue,
            job_id=job_id,
            payload=b"new",
            update_mask=field_mask_pb2.FieldMask(paths=["payload"]),
        ),
        timeout=10,
    )
    assert resp.job.payload == b"new" and dict(resp.job.headers) == {"a": "1"}
    admin.UpdateJob(
        A.UpdateJobRequest(
            queue=queue,
            job_id=job_id,
            headers={"b": "2"},
            update_mask=field_mask_pb2.FieldMask(paths=["headers"]),
        ),
        timeout=10,
    )
    job = query(stub, queue, job_id)
    assert (job.payload, dict(job.headers), job.state) == (b"new", {"b": "2"}, SCHEDULED)


def test_redrive_to_the_same_queue_and_to_another(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    dead = _dead(stub, queue, 4)
    resp = admin.RedriveDeadLetters(
        A.RedriveDeadLettersRequest(queue=queue, job_ids=dead[:1]), timeout=10
    )
    assert (resp.redriven, resp.remaining) == (1, 3)
    job = query(stub, queue, dead[0])
    assert (job.state, job.attempts) == (READY, 0)

    target = f"{queue}-t"
    enqueue(stub, target, b"exists")
    resp = admin.RedriveDeadLetters(
        A.RedriveDeadLettersRequest(queue=queue, target_queue=target, limit=2), timeout=10
    )
    assert (resp.redriven, resp.remaining) == (2, 1)
    moved = admin.ListJobs(A.ListJobsRequest(queue=target, state=READY), timeout=10).jobs
    origins = {j.headers.get("delayq-redriven-from") for j in moved}
    assert len(origins & {f"default/{queue}/{i}" for i in dead[1:]}) == 2


def test_redrive_keeps_to_its_rate(
    admin: admin_pb2_grpc.AdminServiceStub, stub: Stub, queue: str
) -> None:
    _dead(stub, queue, 6)
    started = time.monotonic()
    resp = admin.RedriveDeadLetters(A.RedriveDeadLettersRequest(queue=queue, rate=4), timeout=30)
    # 6 jobs at 4 per second, in chunks of 4: the second chunk waits until 1 s.
    assert resp.redriven == 6 and resp.remaining == 0
    assert time.monotonic() - started >= 1.0
