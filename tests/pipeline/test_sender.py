"""The executor-side sender against a scripted gRPC peer: backoff, per-item retries, metadata.

A scripted peer, not the real server: the real one cannot be made to shed load on cue.
The real-server paths are in test_schedule.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from delayq._backoff import Backoff
from delayq.v1 import service_pb2
from delayq_pipeline.sender import ClientSettings, Item, send_partition


class Shedding:
    """Refuses the first call whole, then the first item of the next one, then takes all."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def EnqueueBatch(
        self, request: service_pb2.EnqueueBatchRequest, context: Any
    ) -> service_pb2.EnqueueBatchResponse:
        with self.lock:
            n = len(self.calls)
            self.calls.append([r.idempotency_key for r in request.requests])
            self.metadata.append(dict(context.invocation_metadata()))
        if n == 0:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "OOM command not allowed")
        out = service_pb2.EnqueueBatchResponse()
        for i, req in enumerate(request.requests):
            result = out.results.add()
            if n == 1 and i == 0:
                result.error.code = grpc.StatusCode.UNAVAILABLE.value[0]
                result.error.message = "try again"
            elif req.queue == "bad":
                result.error.code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
                result.error.message = "requests[0].queue: no"
            else:
                result.response.job_id = "j-" + req.idempotency_key
        return out


@pytest.fixture
def peer() -> Iterator[tuple[Shedding, str]]:
    yield from serve()


@pytest.fixture
def other_peer() -> Iterator[tuple[Shedding, str]]:
    yield from serve()


def serve() -> Iterator[tuple[Shedding, str]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    servicer = Shedding()
    handler = grpc.unary_unary_rpc_method_handler(
        servicer.EnqueueBatch,
        request_deserializer=service_pb2.EnqueueBatchRequest.FromString,
        response_serializer=service_pb2.EnqueueBatchResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "delayq.v1.DelayQueueService", {"EnqueueBatch": handler}
            )
        ]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None).wait()


def item(key: str, queue: str = "q") -> Item:
    return Item(queue, b"p", 1_800_000_000_000, None, key, {"h": "v"}, None, None)


def test_sheds_are_retried_with_backoff_and_the_token_is_sent(peer: tuple[Shedding, str]) -> None:
    servicer, target = peer
    settings = ClientSettings(
        target=target, token="s3cret", batch_size=10, in_flight=1,
        backoff=Backoff(initial=0.01, maximum=0.05),
    )  # fmt: skip
    items = [item(f"k{i}") for i in range(3)] + [item("k3", queue="bad")]

    out = list(send_partition(items, settings))

    stats = out[-1]
    assert (stats.kind, stats.rows, stats.enqueued, stats.retries) == ("stats", 4, 3, 2)
    assert [(r.key, r.stage, r.reason) for r in out[:-1]] == [
        ("k3", "server", "INVALID_ARGUMENT: requests[0].queue: no")
    ]
    # Whole batch again after RESOURCE_EXHAUSTED, then only the item refused as UNAVAILABLE.
    assert servicer.calls == [["k0", "k1", "k2", "k3"], ["k0", "k1", "k2", "k3"], ["k0"]]
    assert {m["authorization"] for m in servicer.metadata} == {"Bearer s3cret"}


def test_a_refusal_that_retrying_cannot_fix_fails_the_task(peer: tuple[Shedding, str]) -> None:
    _, target = peer
    settings = ClientSettings(target=target, retry_deadline=0.0)
    with pytest.raises(RuntimeError, match="still refused"):
        list(send_partition([item("k0")], settings))


def test_partitions_spread_over_several_targets(
    peer: tuple[Shedding, str], other_peer: tuple[Shedding, str]
) -> None:
    (first, a), (second, b) = peer, other_peer
    for shedding in (first, second):  # both peers past their scripted refusals
        shedding.calls += [[], []]
    settings = ClientSettings(target=f"{a}, {b}")
    for partition in range(4):
        list(send_partition([item(f"p{partition}")], settings, partition))
    assert first.calls[2:] == [["p0"], ["p2"]]
    assert second.calls[2:] == [["p1"], ["p3"]]
