"""Client and AsyncClient against a real server: times, payload types, idempotency, batches."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayq import (
    AsyncClient,
    Client,
    EnqueueBatchError,
    InvalidArgumentError,
    JobState,
    Message,
    NotFoundError,
)


def test_enqueue_get_delete_with_times_and_payload_types(target: str) -> None:
    with Client(target) as client:
        before = datetime.now(UTC)
        a = client.enqueue("q", {"k": [1, 2]}, delay=timedelta(minutes=5), headers={"h": "1"})
        assert a.due_time is not None
        assert abs((a.due_time - before).total_seconds() - 300) < 5
        at = datetime.now(UTC) + timedelta(hours=2)
        b = client.enqueue("q", b"\x00raw", at=at, ttl=timedelta(hours=3), max_attempts=4)
        assert b.due_time is not None and abs((b.due_time - at).total_seconds()) < 0.01
        job = client.get("q", a.job_id)
        assert (job.state, job.payload, job.headers["h"]) == (
            JobState.SCHEDULED,
            {"k": [1, 2]},
            "1",
        )
        raw = client.get("q", b.job_id)
        assert (raw.payload, raw.max_attempts) == (b"\x00raw", 4)
        assert raw.expire_time is not None
        assert client.delete("q", a.job_id) == JobState.SCHEDULED
        with pytest.raises(NotFoundError):
            client.get("q", a.job_id)
        with pytest.raises(ValueError, match="either delay or at"):
            client.enqueue("q", "x", delay=1, at=at)


def test_idempotency_key_returns_the_first_job(target: str) -> None:
    with Client(target) as client:
        first = client.enqueue("q", "once", idempotency_key="order-42")
        again = client.enqueue("q", "once", idempotency_key="order-42")
        assert (again.job_id, again.duplicate, first.duplicate) == (first.job_id, True, False)
        assert client.stats("q").enqueued_total == 1


def test_enqueue_many_reports_refused_items_and_stores_the_rest(target: str) -> None:
    with Client(target) as client:
        with pytest.raises(EnqueueBatchError) as info:
            client.enqueue_many("q", ["ok1", Message("bad", queue="no:pe"), "ok2"])
        err = info.value
        assert set(err.errors) == {1}
        assert isinstance(err.errors[1], InvalidArgumentError)
        assert err.results[0] is not None and err.results[2] is not None
        assert client.stats("q").ready == 2


async def test_async_client_round_trip(target: str) -> None:
    async with AsyncClient(target) as client:
        results = await client.enqueue_many("aq", [{"i": i} for i in range(2500)])
        assert len({r.job_id for r in results}) == 2500
        seen = []
        async for d in client.consume(["aq"], max_outstanding=500):
            seen.append(d.payload["i"])
            await client.ack([d.lease_token])
            if len(seen) == 10:
                break
        assert len(set(seen)) == 10 and set(seen) <= set(range(2500))
        stats = await client.stats("aq")
        assert stats.acked_total == 10
