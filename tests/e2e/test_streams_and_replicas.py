"""Stream close releases leases at once; replicas share Redis; graceful shutdown."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, ack, enqueue, ms, query, stats
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, wait_until


def test_cancelled_stream_releases_its_leases_at_once(stub: Stub, queue: str) -> None:
    job_id = enqueue(stub, queue)
    with Consumer(stub, [queue], lease_ms=600_000) as first:
        (d,) = first.take()
    start = time.monotonic()
    with Consumer(stub, [queue], lease_ms=600_000) as second:
        (again,) = second.take(timeout=8)
    assert again.job.id == job_id and again.attempt == 2
    assert time.monotonic() - start < 8  # not the 10 s stall check, nor the 10-minute lease
    assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_STALE]


WORKER = textwrap.dedent(
    """
    import sys, grpc
    from delayq.v1 import service_pb2, service_pb2_grpc
    from google.protobuf import duration_pb2
    stub = service_pb2_grpc.DelayQueueServiceStub(grpc.insecure_channel(sys.argv[1]))
    req = service_pb2.ConsumeRequest(queues=[sys.argv[2]], max_outstanding=5,
                                     lease_duration=duration_pb2.Duration(seconds=600))
    for resp in stub.Consume(req):
        print(len(resp.deliveries), flush=True)
    """
)


def test_killed_worker_process_gets_its_jobs_redelivered_quickly(
    server: DelayqProcess, stub: Stub, queue: str
) -> None:
    for _ in range(3):
        enqueue(stub, queue)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, server.address, queue],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "3"
        assert stats(stub, queue).leased == 3
    finally:
        worker.kill()  # SIGKILL: no goodbye, the TCP connection just drops
        worker.wait()
        if worker.stdout:
            worker.stdout.close()
    killed_at = time.monotonic()
    with Consumer(stub, [queue]) as c:
        got = c.take(3, timeout=8)
    assert time.monotonic() - killed_at < 8  # not the 30 s lease
    assert {d.attempt for d in got} == {2}


def test_two_servers_never_deliver_a_job_twice_within_its_lease(
    redis_server: ManagedRedis, server: DelayqProcess, queue: str
) -> None:
    with DelayqProcess(redis_server.url) as other:
        ch_a, ch_b = server.channel(), other.channel()
        a, b = server.stub(ch_a), other.stub(ch_b)
        seen: Counter[str] = Counter()
        lock = threading.Lock()
        consumers = [
            Consumer(x, [queue], max_outstanding=50, lease_ms=60_000) for x in (a, b, a, b)
        ]
        try:
            reqs = [service_pb2.EnqueueRequest(queue=queue, payload=b"p") for _ in range(200)]
            ids = []
            for producer in (a, b):  # half through each replica
                resp = producer.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs[:100]))
                ids += [r.response.job_id for r in resp.results]
            total = 0
            deadline = time.monotonic() + 20
            while total < 200 and time.monotonic() < deadline:
                for i, c in enumerate(consumers):
                    while not c.received.empty():
                        _, d = c.received.get()
                        with lock:
                            seen[d.job.id] += 1
                        total += 1
                        # ack through the *other* replica: credit must travel back
                        (b if i % 2 == 0 else a).Ack(
                            service_pb2.AckRequest(lease_tokens=[d.lease_token])
                        )
                time.sleep(0.005)
            assert total == 200
            assert set(seen) == set(ids) and max(seen.values()) == 1
            wait_until(lambda: stats(a, queue).acked_total == 200)
        finally:
            for c in consumers:
                c.close()
            ch_a.close()
            ch_b.close()


def test_graceful_shutdown_ends_streams_and_releases_leases(
    redis_server: ManagedRedis, queue: str
) -> None:
    proc = DelayqProcess(redis_server.url, ["--grace", "3s"]).start()
    ch = proc.channel()
    try:
        stub = proc.stub(ch)
        job_id = enqueue(stub, queue)
        c = Consumer(stub, [queue], lease_ms=600_000)
        c.take()
        assert query(stub, queue, job_id).state == job_pb2.JOB_STATE_LEASED
        started = time.monotonic()
        assert proc.terminate(timeout=15) == 0
        assert time.monotonic() - started < 10
        c.thread.join(5)
        assert not c.thread.is_alive()  # the stream ended
    finally:
        ch.close()
        proc.kill()
    with DelayqProcess(redis_server.url) as again, again.channel() as ch2:
        assert query(again.stub(ch2), queue, job_id).state == job_pb2.JOB_STATE_READY


def test_a_job_promoted_by_another_replica_wakes_this_replicas_stream(
    redis_server: ManagedRedis, server: DelayqProcess, stub: Stub, queue: str
) -> None:
    with DelayqProcess(redis_server.url) as other, other.channel() as ch:
        enqueue(other.stub(ch), queue)  # both replicas now run timers for the queue
        with Consumer(stub, [queue]) as c:
            c.take()
            # Due in 300 ms: whichever replica's promoter gets there first, the
            # idle stream here must wake at once, not at a fallback re-check.
            for _ in range(5):
                job_id = enqueue(other.stub(ch), queue, delay=ms(300))
                (d,) = c.take(timeout=10)  # the fallback re-check is at 30 s
                assert d.job.id == job_id
                ack(stub, d.lease_token)


def test_a_lease_dropped_without_credit_is_found_by_the_stall_check(stub: Stub, queue: str) -> None:
    # A leased job whose TTL runs out is dropped by the janitor; no ack, nack
    # or credit message ever names it, so only the stream's re-check frees the slot.
    enqueue(stub, queue, ttl=ms(1_500))
    with Consumer(stub, [queue], max_outstanding=1, lease_ms=600_000) as c:
        c.take()
        second = enqueue(stub, queue)
        (d,) = c.take(timeout=20)  # STALL_CHECK_S is 10 s
    assert d.job.id == second
