"""A worker frozen past its lease (SIGSTOP, a long GC pause) gets no more work:
its job goes to a live worker, and attempts are not used up on a stream nobody reads."""

from __future__ import annotations

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, Stub, ack, enqueue, ms


def test_an_expired_lease_gives_its_stream_no_credit_back(stub: Stub, queue: str) -> None:
    retry = job_pb2.RetryPolicy(initial_backoff=ms(0))
    with Consumer(stub, [queue], max_outstanding=1, lease_ms=1_000) as frozen:
        job_id = enqueue(stub, queue, retry=retry, max_attempts=3)
        (held,) = frozen.take()  # ... and never answered: the worker is frozen
        with Consumer(stub, [queue], max_outstanding=10) as live:
            (again,) = live.take(timeout=30)  # the lease ran out; the live one gets it
            assert (again.job.id, again.attempt) == (job_id, 2)
            later = [enqueue(stub, queue) for _ in range(5)]
            got = live.take(5, timeout=30)
            assert {d.job.id for d in got} == set(later)
            assert (
                ack(stub, again.lease_token, *(d.lease_token for d in got))
                == [service_pb2.ACK_RESULT_ACKED] * 6
            )
        # Nothing reached the frozen stream after its lease ran out.
        assert frozen.received.empty()
        # When it wakes up, its late ack is refused, and that answer frees its slot.
        assert ack(stub, held.lease_token) == [service_pb2.ACK_RESULT_STALE]
        fresh = enqueue(stub, queue)
        (d,) = frozen.take(timeout=30)
        assert d.job.id == fresh
