"""GetQueueStats.backlog_due: when the backlog falls due (minute, hour, day, later)."""

from __future__ import annotations

from google.protobuf.duration_pb2 import Duration

from delayq.v1 import service_pb2
from tests.support.rpc import Stub


def test_stats_split_the_backlog_by_due_time(stub: Stub, queue: str) -> None:
    # 90 s, not 61: a slow machine takes more than a second between these calls.
    delays = {"within_minute": [0, 5, 59], "within_hour": [90, 3000], "within_day": [7200],
              "later": [86_400 + 60, 30 * 86_400]}  # fmt: skip
    for seconds in (s for group in delays.values() for s in group):
        stub.Enqueue(
            service_pb2.EnqueueRequest(queue=queue, payload=b"x", delay=Duration(seconds=seconds))
        )
    stats = stub.GetQueueStats(service_pb2.GetQueueStatsRequest(queue=queue)).stats
    due = stats.backlog_due
    # The job due now is ready, not backlog; the others keep to their ranges.
    assert (due.within_minute, due.within_hour, due.within_day, due.later) == (2, 2, 1, 2)
    assert stats.scheduled == 7 and stats.ready == 1
