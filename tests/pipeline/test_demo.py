"""`make pipeline-demo`'s wait: the worker runs until the jobs it generated have run."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from delayq import Client
from delayq_pipeline import demo
from tests.support.servers import DelayqProcess


def test_the_wait_holds_for_jobs_due_more_than_a_minute_out(
    pipeline_server: DelayqProcess, redis_url: str, queue: str
) -> None:
    # The demo's jobs fall due 90-120 s after generation; when scheduling ends they
    # can still be more than a minute out. Its wait once looked only a minute ahead,
    # stopped the worker at once, and the report was empty.
    with Client(pipeline_server.address) as client:
        client.enqueue(queue, b"later", delay=timedelta(seconds=75))
    until = datetime.now(UTC) + timedelta(seconds=2)
    started = time.monotonic()
    demo._wait_idle(pipeline_server.address, [queue], until, deadline_s=60)
    assert datetime.now(UTC) >= until
    # Past `until` it does not wait for the job 75 s out (or the 60 s deadline):
    # jobs due later than a minute, like the demo's day-long tail, are not waited for.
    assert time.monotonic() - started < 30
