"""GetQueueStats reads each shard at one instant.

A drain that waits for "nothing scheduled, ready or leased" (the chaos suite's,
or an operator's before a deploy) must not see zero while a job is moving
between the backlog, the ready list and a lease. One CI run of the SIGSTOP
redis fault did: a nacked job was counted in none of them, the drain ended, and
the job was leased again a moment later.
"""

from __future__ import annotations

import threading

from delayq.v1 import service_pb2
from tests.support.rpc import Consumer, Stub, enqueue, ms, stats

JOBS = 20
POLLS = 1_500
LAST_ATTEMPT = 900  # churn stops well before max_attempts: nothing dead-letters


def test_a_job_moving_between_backlog_ready_and_lease_is_always_counted_once(
    stub: Stub, queue: str
) -> None:
    for _ in range(JOBS):
        enqueue(stub, queue, max_attempts=1000)
    stop = threading.Event()

    def churn() -> None:  # every delivery nacked 1 ms ahead: backlog, ready, lease, again
        with Consumer(stub, [queue], max_outstanding=JOBS) as c:
            while not stop.is_set():
                for d in c.take(1, timeout=30):
                    if d.attempt < LAST_ATTEMPT:
                        stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token, delay=ms(1)))

    worker = threading.Thread(target=churn, daemon=True)
    worker.start()
    wrong = []
    try:
        for _ in range(POLLS):
            s = stats(stub, queue)
            moving = (s.scheduled, s.ready, s.leased)
            if sum(moving) != JOBS:
                wrong.append(f"scheduled, ready, leased = {moving}")
            elif s.scheduled and not s.HasField("next_due_time"):
                wrong.append(f"{moving} with no next due time")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not wrong, f"{len(wrong)} of {POLLS} snapshots miscounted, e.g. {wrong[:5]}"
    assert stats(stub, queue).retried_total > POLLS // 10, "the jobs barely moved"
