"""Trace context crosses the queue; with --otel, spans and metrics reach an OTLP receiver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from delayq.v1 import service_pb2
from tests.support.rpc import Consumer, Stub, ack
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


class Receiver(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    """A real OTLP/gRPC endpoint that keeps what it is sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.metric_names: set[str] = set()
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        self.spans.extend(ss.spans)
                return trace_service_pb2.ExportTraceServiceResponse()
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    self.metric_names.update(m.name for m in sm.metrics)
            return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def receiver() -> Iterator[tuple[Receiver, int]]:
    recv = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(recv, server)  # type: ignore[no-untyped-call]
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(recv, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield recv, port
    server.stop(None)


def _roundtrip(stub: Stub, queue: str) -> dict[str, str]:
    """Enqueue with the producer's trace context in gRPC metadata; return the consumed headers."""
    stub.Enqueue(
        service_pb2.EnqueueRequest(queue=queue, payload=b"x", headers={"k": "v"}),
        metadata=(("traceparent", PARENT),),
    )
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
        ack(stub, d.lease_token)
    return dict(d.job.headers)


def test_callers_trace_context_travels_with_the_job(stub: Stub, queue: str) -> None:
    headers = _roundtrip(stub, queue)
    assert headers == {"k": "v", "traceparent": PARENT}


def test_explicit_traceparent_header_wins(stub: Stub, queue: str) -> None:
    mine = f"00-{'1' * 32}-{'2' * 16}-01"
    stub.Enqueue(
        service_pb2.EnqueueRequest(queue=queue, payload=b"x", headers={"traceparent": mine}),
        metadata=(("traceparent", PARENT),),
    )
    with Consumer(stub, [queue]) as c:
        (d,) = c.take()
    assert d.job.headers["traceparent"] == mine


def test_otel_exports_spans_of_one_trace_and_metrics(
    redis_server: ManagedRedis, receiver: tuple[Receiver, int], queue: str
) -> None:
    recv, port = receiver
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "300",
    }
    with DelayqProcess(redis_server.url, ["--otel"], env=env) as server, server.channel() as ch:
        headers = _roundtrip(server.stub(ch), queue)
        # The stored context is the Enqueue server span's: same trace, new span id.
        version, trace_id, span_id, _flags = headers["traceparent"].split("-")
        assert (version, trace_id) == ("00", TRACE_ID) and span_id != "00f067aa0ba902b7"

        def exported() -> bool:
            with recv.lock:
                names = {s.name for s in recv.spans if s.trace_id.hex() == TRACE_ID}
                return {
                    "/delayq.v1.DelayQueueService/Enqueue",
                    f"{queue} deliver",
                } <= names and "delayq.jobs.enqueued" in recv.metric_names

        wait_until(exported, timeout=15, interval=0.1)
        with recv.lock:
            deliver = next(s for s in recv.spans if s.name == f"{queue} deliver")
        assert deliver.parent_span_id.hex() == span_id  # continues from the Enqueue span
        # ... and links to it, the link carrying how late the delivery was.
        (link,) = deliver.links
        assert link.span_id.hex() == span_id
        assert {a.key for a in link.attributes} == {"delayq.lateness_ms"}
    assert {"delayq.jobs.delivered", "delayq.delivery.lateness"} <= recv.metric_names


def _console_spans(server: DelayqProcess) -> list[dict[str, Any]]:
    """Spans the console exporter printed (one JSON object per span, pretty-printed)."""
    text = "".join(server.output)
    spans, decoder, i = [], json.JSONDecoder(), 0
    while (i := text.find("{\n", i)) >= 0:
        obj, end = decoder.raw_decode(text, i)
        spans.append(obj)
        i = end
    return spans


def test_console_exporter_and_service_name_from_the_environment(
    redis_server: ManagedRedis, queue: str
) -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "console",  # tracing on without --otel
        "OTEL_SERVICE_NAME": "billing-delayq",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with DelayqProcess(redis_server.url, env=env) as server, server.channel() as ch:
        _roundtrip(server.stub(ch), queue)

        def printed() -> bool:
            return any(s["name"] == f"{queue} deliver" for s in _console_spans(server))

        wait_until(printed, timeout=15, interval=0.1)
    spans = _console_spans(server)
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"billing-delayq"}
    deliver = next(s for s in spans if s["name"] == f"{queue} deliver")
    assert deliver["context"]["trace_id"] == "0x" + TRACE_ID
    assert deliver["attributes"]["messaging.destination.name"] == queue
    assert "delayq.lateness_ms" in deliver["links"][0]["attributes"]


def test_sampler_from_the_environment(redis_server: ManagedRedis, queue: str) -> None:
    env = {
        "OTEL_TRACES_EXPORTER": "console",
        "OTEL_TRACES_SAMPLER": "always_off",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    with DelayqProcess(redis_server.url, env=env) as server, server.channel() as ch:
        headers = _roundtrip(server.stub(ch), queue)
    # Nothing sampled, nothing printed; the caller's trace id still travels with the job.
    assert _console_spans(server) == []
    assert headers["traceparent"].split("-")[1] == TRACE_ID


def test_unknown_exporter_is_refused_in_one_line(redis_server: ManagedRedis) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "delayq_server", "--redis-url", redis_server.url,
         "--listen", "127.0.0.1:0", "--otel"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "OTEL_TRACES_EXPORTER": "zipkin"},
    )  # fmt: skip
    assert out.returncode == 2
    assert "OTEL_TRACES_EXPORTER: zipkin is not one of console, none, otlp" in out.stderr
