"""`make bench-telemetry`: enqueue jobs/s with telemetry off, /metrics on, and tracing on.

Issue 13: the cost of observability, measured in one run. Each run gets a
fresh redis-server and server; the modes alternate, each going first in turn,
so machine noise hits all alike. "traces" is --otel exporting spans and
metrics over OTLP/gRPC to a sink in this process (every span exported, the
default parentbased_always_on sampler). Reported: medians over the rounds,
single Enqueue (N concurrent callers) and EnqueueBatch, and the ratio to off.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Sink(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    """An OTLP receiver that counts and drops."""

    spans = 0

    def Export(self, request: Any, context: Any) -> Any:
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            self.spans += sum(
                len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans
            )
            return trace_service_pb2.ExportTraceServiceResponse()
        return metrics_service_pb2.ExportMetricsServiceResponse()


async def _single(address: str, total: int, concurrency: int) -> float:
    md = (("traceparent", TRACEPARENT),)  # a traced producer: the worst case for tracing
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        req = service_pb2.EnqueueRequest(queue="bench", payload=b"x" * 100)
        await stub.Enqueue(req, metadata=md)
        left = total

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await stub.Enqueue(req, metadata=md)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return total / (time.perf_counter() - start)


async def _batched(address: str, batches: int, size: int) -> float:
    md = (("traceparent", TRACEPARENT),)
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        one = service_pb2.EnqueueRequest(queue="bench-batch", payload=b"x" * 100)
        req = service_pb2.EnqueueBatchRequest(requests=[one] * size)
        await stub.EnqueueBatch(req, metadata=md)
        start = time.perf_counter()
        await asyncio.gather(*(stub.EnqueueBatch(req, metadata=md) for _ in range(batches)))
        return batches * size / (time.perf_counter() - start)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (/proc), robust to a busy machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(mode: str, args: argparse.Namespace, sink_port: int) -> tuple[float, float, float]:
    flags = {"off": [], "metrics": ["--http-listen", "127.0.0.1:0"], "traces": ["--otel"]}[mode]
    # Enqueue quotas off: their cost is bench-auth's subject, not this one's.
    flags += ["--quota-enqueue-rate", "0", "--quota-jobs", "0"]
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink_port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        ManagedRedis(Path(tmp) / "redis", appendonly=False) as redis,
        DelayqProcess(redis.url, flags, env=env) as proc,
    ):
        assert proc.proc is not None
        cpu = _cpu_s(proc.proc.pid)
        one = asyncio.run(_single(proc.address, args.single, args.concurrency))
        cpu_us = (_cpu_s(proc.proc.pid) - cpu) / args.single * 1e6
        batched = asyncio.run(_batched(proc.address, args.batches, args.batch_size))
        return one, batched, cpu_us


def main() -> None:
    ap = argparse.ArgumentParser(prog="bench.telemetry", description=__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--single", type=int, default=5000, help="Enqueue calls per round")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20, help="EnqueueBatch calls per round")
    ap.add_argument("--batch-size", type=int, default=1000)
    args = ap.parse_args()
    sink = Sink()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    modes = ["off", "metrics", "traces"]
    results: dict[str, list[float]] = {f"{m} {k}": [] for m in modes for k in "1bc"}
    try:
        for _ in range(args.rounds):
            modes = modes[1:] + modes[:1]
            for mode in modes:
                one, batched, cpu_us = _run(mode, args, port)
                results[f"{mode} 1"].append(one)
                results[f"{mode} b"].append(batched)
                results[f"{mode} c"].append(cpu_us)
    finally:
        server.stop(None)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"rounds: {args.rounds} (alternating), median jobs/s; spans exported: {sink.spans:,}")
    print("| API | off | /metrics on (ratio) | tracing on, OTLP (ratio) |")
    print("|---|---|---|---|")
    for api, key in (
        (f"Enqueue x{args.concurrency} concurrent", "1"),
        (f"EnqueueBatch of {args.batch_size}", "b"),
    ):
        off, m, t = med[f"off {key}"], med[f"metrics {key}"], med[f"traces {key}"]
        print(f"| {api} | {off:,.0f} | {m:,.0f} ({m / off:.2f}) | {t:,.0f} ({t / off:.2f}) |")
    off, m, t = med["off c"], med["metrics c"], med["traces c"]
    cells = f"{off:,.0f} | {m:,.0f} ({m / off:.2f}) | {t:,.0f} ({t / off:.2f})"
    print(f"| server CPU per unary Enqueue (us) | {cells} |")


if __name__ == "__main__":
    main()
