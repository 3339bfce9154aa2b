"""Lateness at a given due rate through a real server, with the big backlog in place
in the same queue: the client's receive time minus the job's due time."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import grpc

from bench.harness.delayq_runner import Consumer
from bench.harness.stats import percentile
from bench.scale_probe import proc_cpu_s, redis_cpu_s
from delayq.v1 import job_pb2, service_pb2, service_pb2_grpc
from delayq_server.store import Store
from tests.support.servers import DelayqProcess

BATCH = 1000


async def _run(
    address: str, namespace: str, queue: str, rate: float, seconds: float, payload: bytes
) -> tuple[list[float], int]:
    jobs = int(rate * seconds)
    rng = random.Random(7)
    lead_ms = 2_000 + jobs / 20  # every job stored before the first falls due
    t0 = time.time() * 1000 + lead_ms
    due_ms = sorted(int(t0 + rng.random() * seconds * 1000) for _ in range(jobs))
    late: list[float] = []
    async with grpc.aio.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        # Acks go out from their own task, gathered (as the benchmark's runner does):
        # a consumer that awaited an Ack per delivery message fell behind at 1,000
        # messages/s and its queueing showed up as hundreds of ms of "lateness".
        consumer = Consumer(stub, max_outstanding=2000, max_batch=100)
        consumer.request.namespace = namespace
        consumer.request.queues[:] = [queue]

        def on_delivery(d: job_pb2.Delivery) -> None:
            late.append((time.time_ns() - d.job.due_time.ToNanoseconds()) / 1e6)

        consuming = asyncio.create_task(consumer.run(on_delivery, jobs))
        late_stores = 0
        for i in range(0, jobs, BATCH):
            reqs = []
            for d in due_ms[i : i + BATCH]:
                req = service_pb2.EnqueueRequest(namespace=namespace, queue=queue, payload=payload)
                req.due_time.FromMilliseconds(d)
                reqs.append(req)
            await stub.EnqueueBatch(service_pb2.EnqueueBatchRequest(requests=reqs))
            late_stores += time.time() * 1000 > due_ms[i]
        await asyncio.wait_for(consuming, lead_ms / 1000 + seconds + 120)
    return late, late_stores


async def lateness(
    redis_url: str,
    store: Store,
    namespace: str,
    queue: str,
    rate: float,
    seconds: float,
    payload: bytes,
) -> dict[str, Any]:
    with DelayqProcess(redis_url) as server:
        assert server.proc is not None
        cpu0, redis0 = proc_cpu_s(server.proc.pid), await redis_cpu_s(store)
        late, late_stores = await _run(server.address, namespace, queue, rate, seconds, payload)
        cpu1, redis1 = proc_cpu_s(server.proc.pid), await redis_cpu_s(store)
    return {
        "rate": rate,
        "jobs": len(late),
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "max_ms": max(late),
        "early": sum(1 for v in late if v < 0),
        "batches_stored_late": late_stores,
        "server_cpu_s": cpu1 - cpu0,
        "redis_cpu_s": redis1 - redis0,
    }
