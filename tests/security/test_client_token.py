"""AsyncClient and Worker carry `token=` on every call, the Consume stream included."""

from __future__ import annotations

import asyncio

import pytest

from delayq import AsyncClient, Delivery, Worker
from delayq.errors import UnauthenticatedError
from tests.support.auth import AuthServer


async def test_async_client_and_worker_with_a_token(auth_srv: AuthServer) -> None:
    ns = "worker-token"
    producer = auth_srv.token(ns, "produce", "read")
    consumer = auth_srv.token(ns, "consume")
    async with AsyncClient(auth_srv.address, namespace=ns, token=producer) as client:
        await client.enqueue_many("jobs", [f"j{i}" for i in range(10)])
        async with AsyncClient(auth_srv.address, namespace=ns) as anon:
            with pytest.raises(UnauthenticatedError):
                await anon.enqueue("jobs", "x")
        seen: list[object] = []
        all_seen = asyncio.Event()
        worker = Worker(auth_srv.address, namespace=ns, token=consumer, concurrency=4)

        @worker.handler("jobs")
        async def handle(d: Delivery) -> None:
            seen.append(d.payload)
            if len(seen) == 10:
                all_seen.set()

        task = asyncio.create_task(worker.serve())
        await asyncio.wait_for(all_seen.wait(), 30)
        worker.stop()
        await asyncio.wait_for(task, 30)
        assert sorted(seen) == sorted(f"j{i}" for i in range(10))  # type: ignore[type-var]
        stats = await client.stats("jobs")
        assert stats.acked_total == 10
