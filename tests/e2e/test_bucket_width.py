"""A queue keeps the bucket width it was created with across restarts with another flag."""

from __future__ import annotations

import time

from tests.support.rpc import Consumer, enqueue, ms, stats
from tests.support.servers import DelayqProcess


def test_backlog_written_with_one_width_is_delivered_after_a_restart_with_another(
    redis_url: str,
) -> None:
    due: dict[str, float] = {}
    with DelayqProcess(redis_url, ["--bucket-width", "1s"]) as first, first.channel() as ch:
        stub = first.stub(ch)
        for delay in (1_500, 2_500, 3_500):
            start = time.time()  # before the call: the server's due time is later
            due[enqueue(stub, "widths", delay=ms(delay))] = start + delay / 1000
    with DelayqProcess(redis_url, ["--bucket-width", "10m"]) as second, second.channel() as ch:
        stub = second.stub(ch)
        start = time.time()
        later = enqueue(stub, "widths", delay=ms(1_000))  # stored with the queue's 1 s too
        due[later] = start + 1.0
        with Consumer(stub, ["widths"]) as c:
            got = c.take_timed(4, timeout=60)
        for arrived, d in got:
            assert arrived >= due[d.job.id]  # never early
            assert arrived < due[d.job.id] + 30  # and not stranded until some fallback
        assert {d.job.id for _, d in got} == set(due)
        assert stats(stub, "widths").scheduled == 0
