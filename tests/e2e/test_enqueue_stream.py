"""EnqueueStream over real gRPC on a real Redis: answers by batch id, refusals per
message (the stream goes on, Redis untouched), and the stream's own refusals."""

from __future__ import annotations

import queue as queue_mod
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from delayq.v1 import job_pb2, service_pb2
from delayq_server.rpc.enqueue_stream import BATCHES_IN_FLIGHT
from tests.support.digest import redis_digest
from tests.support.rpc import Stub, ms
from tests.support.servers import DelayqProcess, ManagedRedis

E = service_pb2.EnqueueRequest
S = service_pb2.EnqueueStreamRequest
INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def answers(
    stub: Stub, batches: list[service_pb2.EnqueueStreamRequest]
) -> dict[int, service_pb2.EnqueueStreamResponse]:
    """Sends the batches, half-closes, and returns every answer by batch id."""
    out: dict[int, service_pb2.EnqueueStreamResponse] = {}
    for resp in stub.EnqueueStream(iter(batches), timeout=30):
        assert resp.batch_id not in out, "one answer per batch"
        out[resp.batch_id] = resp
    return out


def test_each_batch_is_answered_by_its_id_and_stored(stub: Stub, queue: str) -> None:
    batches = [
        S(batch_id=1000 + b, requests=[E(queue=queue, payload=f"{b}-{i}".encode(), delay=ms(60_000)) for i in range(b + 1)])
        for b in range(3 * BATCHES_IN_FLIGHT)
    ]  # fmt: skip
    got = answers(stub, batches)
    assert sorted(got) == [b.batch_id for b in batches]
    ids: set[str] = set()
    for b in batches:
        resp = got[b.batch_id]
        assert not resp.HasField("error")
        assert len(resp.results) == len(b.requests)
        for req, result in zip(b.requests, resp.results, strict=True):
            assert not result.HasField("error")
            job = stub.Query(
                service_pb2.QueryRequest(queue=queue, job_id=result.response.job_id), timeout=10
            ).job
            assert job.payload == req.payload  # index-aligned with the batch
            assert job.state == job_pb2.JOB_STATE_SCHEDULED
            ids.add(result.response.job_id)
    assert len(ids) == sum(len(b.requests) for b in batches)


def test_idempotency_keys_hold_across_batches_of_one_stream(stub: Stub, queue: str) -> None:
    first = S(batch_id=1, requests=[E(queue=queue, payload=b"a", idempotency_key="k1")])
    again = S(batch_id=2, requests=[E(queue=queue, payload=b"b", idempotency_key="k1")])
    got = answers(stub, [first])
    got |= answers(stub, [again])
    assert not got[1].results[0].response.duplicate
    assert got[2].results[0].response.duplicate
    assert got[2].results[0].response.job_id == got[1].results[0].response.job_id


def test_a_jobs_own_trace_context_is_kept(stub: Stub, queue: str) -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    got = answers(
        stub, [S(batch_id=7, requests=[E(queue=queue, payload=b"t", headers={"traceparent": tp})])]
    )
    job_id = got[7].results[0].response.job_id
    job = stub.Query(service_pb2.QueryRequest(queue=queue, job_id=job_id), timeout=10).job
    assert job.headers["traceparent"] == tp


def test_the_stream_stays_open_between_batches(stub: Stub, queue: str) -> None:
    """A batch is answered while the client still holds the stream open."""
    outbox: queue_mod.Queue[service_pb2.EnqueueStreamRequest | None] = queue_mod.Queue()

    def requests() -> Iterator[service_pb2.EnqueueStreamRequest]:
        while (item := outbox.get()) is not None:
            yield item

    call: Any = stub.EnqueueStream(requests(), timeout=30)
    try:
        for n in range(1, 4):
            outbox.put(S(batch_id=n, requests=[E(queue=queue, payload=b"x")]))
            resp = next(call)
            assert resp.batch_id == n and resp.results[0].response.job_id
    finally:
        outbox.put(None)
    assert list(call) == []  # half-closed with nothing in flight: the stream ends OK
    assert call.code() == grpc.StatusCode.OK


# -- refusals ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def isolated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Stub, redis.Redis, DelayqProcess]]:
    """A server on a Redis of its own, so nothing else writes while we compare."""
    with (
        ManagedRedis(Path(tmp_path_factory.mktemp("stream")), appendonly=False) as r,
        DelayqProcess(r.url) as server,
        server.channel() as ch,
    ):
        client = redis.Redis.from_url(r.url)
        stub = server.stub(ch)
        stub.Enqueue(E(queue="known", payload=b"x", delay=ms(3_600_000)))
        yield stub, client, server
        client.close()


REFUSED = [
    # (id, batch, code, message start)
    ("empty", S(batch_id=1), INVALID, "requests: give 1 to 1000 jobs, got 0"),
    ("over the cap", S(batch_id=2, requests=[E(queue="q", payload=b"x")] * 1001), INVALID, "requests: give 1 to 1000 jobs, got 1001"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("batch", "code", "start"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_refused_batch_is_answered_and_the_stream_goes_on(
    isolated: tuple[Stub, redis.Redis, DelayqProcess],
    batch: service_pb2.EnqueueStreamRequest,
    code: int,
    start: str,
) -> None:
    stub, r, _ = isolated
    before = redis_digest(r)
    got = answers(stub, [batch])
    assert got[batch.batch_id].error.code == code
    assert got[batch.batch_id].error.message.startswith(start)
    assert not got[batch.batch_id].results
    assert redis_digest(r) == before
    # The same stream takes the next batch after a refused one.
    good = S(batch_id=99, requests=[E(queue="known", payload=b"y", delay=ms(3_600_000))])
    got = answers(stub, [batch, good])
    assert got[batch.batch_id].error.code == code
    assert got[99].results[0].response.job_id


def test_a_refused_job_is_answered_alone(isolated: tuple[Stub, redis.Redis, DelayqProcess]) -> None:
    stub, r, _ = isolated
    bad = E(queue="a{b}", payload=b"x")
    got = answers(stub, [S(batch_id=5, requests=[E(queue="known", payload=b"ok"), bad])])
    ok, refused = got[5].results
    assert ok.response.job_id
    assert refused.error.code == INVALID
    assert refused.error.message.startswith("requests[1].queue")
    assert not list(r.scan_iter(match="*a{b}*"))
    assert r.sismember("dq:queues", "default/known") and not r.sismember(
        "dq:queues", "default/a{b}"
    )


def test_undecodable_bytes_end_the_stream(
    isolated: tuple[Stub, redis.Redis, DelayqProcess],
) -> None:
    _, r, server = isolated
    before = redis_digest(r)
    with server.channel() as ch:
        raw = ch.stream_stream(
            "/delayq.v1.DelayQueueService/EnqueueStream",
            request_serializer=None,
            response_deserializer=None,
        )
        call = raw(iter([b"\xff\xff\xff"]), timeout=10)
        with pytest.raises(grpc.RpcError) as info:
            list(call)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid delayq.v1.EnqueueStreamRequest" in (info.value.details() or "")
    assert redis_digest(r) == before


def test_many_batches_in_flight_all_answered(
    isolated: tuple[Stub, redis.Redis, DelayqProcess],
) -> None:
    """More batches than the server stores at once: the rest wait unread, none is lost."""
    stub, _, _ = isolated
    n = 4 * BATCHES_IN_FLIGHT
    batches = [S(batch_id=i, requests=[E(queue="known", payload=b"z")] * 50) for i in range(n)]
    got = answers(stub, batches)
    assert sorted(got) == list(range(n))
    assert all(len(g.results) == 50 and not g.HasField("error") for g in got.values())


def test_a_stream_cut_by_the_client_leaves_the_server_serving(
    isolated: tuple[Stub, redis.Redis, DelayqProcess],
) -> None:
    stub, _, _ = isolated
    gate = threading.Event()

    def requests() -> Iterator[service_pb2.EnqueueStreamRequest]:
        yield S(batch_id=1, requests=[E(queue="known", payload=b"c")])
        gate.wait(10)

    call: Any = stub.EnqueueStream(requests(), timeout=30)
    assert next(call).batch_id == 1
    call.cancel()
    gate.set()
    assert answers(stub, [S(batch_id=2, requests=[E(queue="known", payload=b"d")])])[2].results


def test_shutdown_answers_what_was_read_and_ends_the_stream_unavailable(
    tmp_path: Path,
) -> None:
    """A graceful stop does not wait out its grace for open EnqueueStreams: each answers
    the batches it read and ends UNAVAILABLE, so its client sends the rest elsewhere."""
    with (
        ManagedRedis(tmp_path / "redis", appendonly=False) as r,
        DelayqProcess(r.url, ["--grace", "120s"]) as server,
        server.channel() as ch,
    ):
        stub = server.stub(ch)
        outbox: queue_mod.Queue[service_pb2.EnqueueStreamRequest | None] = queue_mod.Queue()

        def requests() -> Iterator[service_pb2.EnqueueStreamRequest]:
            while (item := outbox.get()) is not None:
                yield item

        call: Any = stub.EnqueueStream(requests(), timeout=300)
        outbox.put(S(batch_id=1, requests=[E(queue="q", payload=b"kept")]))
        first = next(call)
        assert first.batch_id == 1 and first.results[0].response.job_id
        stopped = threading.Thread(target=server.terminate, kwargs={"timeout": 300})
        stopped.start()
        with pytest.raises(grpc.RpcError) as info:
            next(call)
        outbox.put(None)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "shutting down" in (info.value.details() or "")
        stopped.join()
        client = redis.Redis.from_url(r.url)
        assert int(client.hget("dq:{default/q/0}:stats", "enqueued") or 0) == 1
        client.close()
