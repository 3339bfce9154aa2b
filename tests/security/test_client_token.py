"""AsyncClient and Worker carry `token=` on every call, the Consume stream included."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from delayq import AsyncClient, Batching, Client, Delivery, Worker
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


async def test_a_stream_refused_at_open_reports_its_own_status(auth_srv: AuthServer) -> None:
    """The AsyncClient writes batches only once the server accepted its EnqueueStream: a
    write that raced the refusal made grpc.aio report INTERNAL instead (grpc#36066)."""
    async with AsyncClient(auth_srv.address, namespace="refused-open") as anon:
        for _ in range(50):  # each round opens a new stream, refused again
            outcomes = await asyncio.gather(
                *(anon.enqueue("jobs", i) for i in range(100)), return_exceptions=True
            )
            assert all(isinstance(o, UnauthenticatedError) for o in outcomes), {
                type(o).__name__ for o in outcomes
            }


def test_a_blocking_client_stream_refused_at_open_reports_its_own_status(
    auth_srv: AuthServer,
) -> None:
    """The blocking Client's EnqueueStream (batching on) refused at open: every caller
    gets UNAUTHENTICATED (not UNAVAILABLE or INTERNAL), round after round."""
    with Client(auth_srv.address, namespace="refused-open-sync", batching=Batching()) as anon:
        for _ in range(20):  # each round opens a new stream, refused again
            with ThreadPoolExecutor(20) as pool:
                outcomes = list(pool.map(lambda i: _outcome(anon, i), range(40)))
            assert all(isinstance(o, UnauthenticatedError) for o in outcomes), {
                type(o).__name__ for o in outcomes
            }


def _outcome(client: Client, i: int) -> object:
    try:
        return client.enqueue("jobs", i)
    except Exception as exc:
        return exc
