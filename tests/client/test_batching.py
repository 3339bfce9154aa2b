"""Client-side batching (issue 12): concurrent enqueues become few calls, each caller its answer."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import grpc
import pytest
from grpc import aio

from delayq import AsyncClient, Batching, Client, InvalidArgumentError, UnavailableError
from delayq._batcher import AsyncBatcher, Outcome, ThreadBatcher
from delayq._channel import channel_options
from delayq.errors import DelayqError
from delayq.models import EnqueueResult
from delayq.v1 import service_pb2
from tests.support.servers import free_port

ENQUEUE = "/delayq.v1.DelayQueueService/Enqueue"
BATCH = "/delayq.v1.DelayQueueService/EnqueueBatch"
STREAM = "/delayq.v1.DelayQueueService/EnqueueStream"


class AioCounter(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Counts the unary calls a channel makes, by method."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        method = details.method
        self.calls[method.decode() if isinstance(method, bytes) else method] += 1
        return await continuation(details, request)


class SyncCounter(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    """Counts the calls a channel starts, by method, and the messages its streams send."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.messages = 0
        self._lock = threading.Lock()

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        self._count(details.method)
        return continuation(details, request)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Iterator[Any]
    ) -> Any:
        self._count(details.method)

        def counted() -> Iterator[Any]:
            for m in requests:
                with self._lock:
                    self.messages += 1
                yield m

        return continuation(details, counted())


# The call transport (Batching.stream=False); the EnqueueStream transport that is the
# default is tested with the same cases in test_enqueue_stream_client.py.
CALLS = Batching(stream=False)


async def test_concurrent_async_enqueues_travel_in_few_batch_calls(target: str) -> None:
    counter = AioCounter()
    channel = aio.insecure_channel(
        target, options=channel_options(), interceptors=[cast(Any, counter)]
    )
    async with AsyncClient(channel=channel, batching=CALLS) as client:
        results = await asyncio.gather(*(client.enqueue("q", {"n": i}) for i in range(200)))
        assert len({r.job_id for r in results}) == 200
        # 200 calls started in one loop turn: spread over the 4 slots (25 or more each).
        assert counter.calls[BATCH] == 4 and counter.calls[ENQUEUE] == 0, counter.calls
        stats = await client.stats("q")
        assert stats.enqueued_total == 200
        jobs = await asyncio.gather(*(client.get("q", r.job_id) for r in results[:3]))
        assert [j.payload for j in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    await channel.close(None)


class AioOverlap(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    """Counts EnqueueBatch calls in flight at once (sent and not yet answered)."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.calls = 0

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        method = details.method
        if (method.decode() if isinstance(method, bytes) else method) != BATCH:
            return await continuation(details, request)
        self.calls += 1
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            call = await continuation(details, request)
            await call  # the answer has arrived: the call is no longer in flight
        finally:
            self.active -= 1
        return call


async def test_busy_async_callers_keep_several_batch_calls_in_flight(target: str) -> None:
    # 50 callers in a loop: with one call in flight at a time the client, the server and
    # Redis work strictly in turn; with several the next batch is built while one is out.
    overlap = AioOverlap()
    channel = aio.insecure_channel(
        target, options=channel_options(), interceptors=[cast(Any, overlap)]
    )
    settings = Batching(max_in_flight=3, stream=False)
    results: list[EnqueueResult] = []
    async with AsyncClient(channel=channel, batching=settings) as client:

        async def caller(n: int) -> None:
            for i in range(20):
                results.append(await client.enqueue("q", {"caller": n, "i": i}))

        await asyncio.gather(*(caller(n) for n in range(50)))
        assert (await client.stats("q")).enqueued_total == 1000
    assert len({r.job_id for r in results}) == 1000
    assert 2 <= overlap.most <= settings.max_in_flight, (overlap.most, overlap.calls)
    await channel.close(None)


async def test_a_lone_async_enqueue_is_a_plain_enqueue_call(target: str) -> None:
    counter = AioCounter()
    channel = aio.insecure_channel(
        target, options=channel_options(), interceptors=[cast(Any, counter)]
    )
    async with AsyncClient(channel=channel, batching=CALLS) as client:
        for i in range(3):
            await client.enqueue("q", i)
    assert counter.calls[ENQUEUE] == 3 and counter.calls[BATCH] == 0, counter.calls
    await channel.close(None)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "calls"])
async def test_each_caller_gets_its_own_refusal(target: str, stream: bool) -> None:
    async with AsyncClient(target, batching=Batching(stream=stream)) as client:
        queues = ["ok", "no:pe", "ok", "also bad!", "ok"]
        outcomes = await asyncio.gather(
            *(client.enqueue(q, i) for i, q in enumerate(queues)), return_exceptions=True
        )
        assert [type(o).__name__ for o in outcomes] == [
            "EnqueueResult",
            "InvalidArgumentError",
            "EnqueueResult",
            "InvalidArgumentError",
            "EnqueueResult",
        ]
        assert "queue" in str(outcomes[1])
        assert (await client.stats("ok")).enqueued_total == 3


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "calls"])
async def test_a_failed_batch_call_fails_every_caller(stream: bool) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    async with AsyncClient(
        dead, timeout=5.0, retry_deadline=0.0, batching=Batching(stream=stream)
    ) as client:
        outcomes = await asyncio.gather(
            *(client.enqueue("q", i) for i in range(5)), return_exceptions=True
        )
    assert all(isinstance(o, UnavailableError) for o in outcomes), outcomes
    assert len({id(o) for o in outcomes}) == 5  # one exception object per caller


@pytest.mark.parametrize("stream", [False, True], ids=["calls", "stream"])
def test_sync_client_batches_calls_from_many_threads(target: str, stream: bool) -> None:
    counter = SyncCounter()
    channel = grpc.intercept_channel(
        grpc.insecure_channel(target, options=channel_options()), counter
    )
    client = Client(channel=channel, batching=Batching(max_delay=0.05, stream=stream))
    start = threading.Barrier(32)

    def one(i: int) -> Outcome:
        start.wait()
        try:
            return client.enqueue("q" if i % 8 else "bad:q", i)
        except DelayqError as err:
            return err

    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(one, range(32)))
    client.close()
    refused = [i for i, o in enumerate(outcomes) if isinstance(o, InvalidArgumentError)]
    assert refused == [0, 8, 16, 24]
    assert all(isinstance(o, EnqueueResult) for i, o in enumerate(outcomes) if i % 8)
    # 32 threads released together: the first batch goes alone, the rest gather behind it
    # (a loaded machine wakes the threads over several round trips: far fewer than 32).
    if stream:
        assert counter.calls == {STREAM: 1}, counter.calls  # no unary Enqueue or EnqueueBatch
        assert 1 <= counter.messages < 24
    else:
        calls = counter.calls[ENQUEUE] + counter.calls[BATCH]
        assert calls < 24, counter.calls
    with Client(target) as plain:
        assert plain.stats("q").enqueued_total == 28
    channel.close()


def _requests(n: int) -> list[service_pb2.EnqueueRequest]:
    return [service_pb2.EnqueueRequest(queue="q", payload=b"%d" % i) for i in range(n)]


async def test_async_close_sends_what_is_still_gathering() -> None:
    release = asyncio.Event()
    leaving = asyncio.Event()
    sent: list[int] = []

    async def send(reqs: list[service_pb2.EnqueueRequest], _deadline: float) -> list[Outcome]:
        sent.append(len(reqs))
        leaving.set()
        await release.wait()
        return [EnqueueResult(job_id=r.payload.decode(), due_time=None) for r in reqs]

    batcher = AsyncBatcher(send, Batching(max_delay=1.0, max_in_flight=1))
    reqs = _requests(4)
    first = batcher.submit(reqs[0], 10.0)
    await leaving.wait()  # the lone job leaves; the others then wait for company
    rest = [batcher.submit(r, 10.0) for r in reqs[1:]]
    assert sent == [1]
    closing = asyncio.ensure_future(batcher.close())
    for _ in range(50):  # a few loop turns, far less than max_delay
        await asyncio.sleep(0)
    assert sent == [1, 3]  # close sent them at once, not after max_delay
    release.set()
    await closing
    assert [f.result().job_id for f in [first, *rest]] == ["0", "1", "2", "3"]
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(reqs[0], 10.0)


async def test_async_jobs_wait_for_company_while_a_call_is_out_and_then_split() -> None:
    sent: list[int] = []
    gates: list[asyncio.Event] = []

    async def send(reqs: list[service_pb2.EnqueueRequest], _deadline: float) -> list[Outcome]:
        sent.append(len(reqs))
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        return [EnqueueResult(job_id=r.payload.decode(), due_time=None) for r in reqs]

    async def turns() -> None:
        for _ in range(50):  # a few loop turns, far less than max_delay
            await asyncio.sleep(0)

    batcher = AsyncBatcher(send, Batching(max_delay=1.0, max_in_flight=2, split_items=3))
    reqs = _requests(9)
    futures = [batcher.submit(reqs[0], 10.0)]
    await turns()
    assert sent == [1]  # nothing was in flight: it went alone, at once
    futures.append(batcher.submit(reqs[1], 10.0))
    await turns()
    assert sent == [1]  # one call is out: a lone job waits for company (max_delay is 1 s)
    futures += [batcher.submit(r, 10.0) for r in reqs[2:4]]
    await turns()
    assert sent == [1, 3]  # 3 waiting fill a call of split_items and a slot is free
    futures += [batcher.submit(r, 10.0) for r in reqs[4:]]
    await turns()
    assert sent == [1, 3]  # both slots busy: the other 5 wait
    gates[0].set()
    await turns()
    assert sent == [1, 3, 5]  # one slot freed: all 5 in it
    gates[1].set()
    gates[2].set()
    await asyncio.wait_for(asyncio.gather(*futures), 10)
    # With both slots free, 7 waiting jobs are spread as 4 + 3 (split_items 3).
    more = [batcher.submit(r, 10.0) for r in reqs[:7]]
    await turns()
    assert sent[3:] == [4, 3]
    for gate in gates[3:]:
        gate.set()
    await batcher.close()
    assert [f.result().job_id for f in futures + more] == [str(i) for i in range(9)] + [
        str(i) for i in range(7)
    ]


def test_thread_close_sends_what_is_still_gathering() -> None:
    release = threading.Event()
    sent: list[int] = []

    def send(reqs: list[service_pb2.EnqueueRequest], timeout: float) -> list[Outcome]:
        sent.append(len(reqs))
        release.wait()
        return [EnqueueResult(job_id=r.payload.decode(), due_time=None) for r in reqs]

    # max_delay 1 s: without the flush on close the last three would still wait.
    batcher = ThreadBatcher(send, Batching(max_delay=1.0))
    reqs = _requests(4)
    futures = [batcher.submit(reqs[0], 10.0)]
    while not sent:
        threading.Event().wait(0.001)
    futures += [batcher.submit(r, 10.0) for r in reqs[1:]]
    closer = threading.Thread(target=batcher.close)
    closer.start()
    release.set()
    closer.join()
    assert all(f.done() for f in futures)
    assert [f.result().job_id for f in futures] == ["0", "1", "2", "3"]
    assert sum(sent) == 4


def test_batching_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_items"):
        Batching(max_items=1001)
    with pytest.raises(ValueError, match="max_bytes"):
        Batching(max_bytes=8 * 1024 * 1024)
    with pytest.raises(ValueError, match="split_items"):
        Batching(max_items=100, split_items=101)


def test_an_error_outcome_maps_to_the_client_error_type() -> None:
    from delayq._common import batch_outcomes

    resp = service_pb2.EnqueueBatchResponse(
        results=[
            service_pb2.EnqueueBatchResult(response=service_pb2.EnqueueResponse(job_id="a")),
            service_pb2.EnqueueBatchResult(
                error=service_pb2.BatchError(code=8, message="redis is full")
            ),
        ]
    )
    ok, err = batch_outcomes(resp, 2)
    assert isinstance(ok, EnqueueResult) and ok.job_id == "a"
    assert type(err).__name__ == "ResourceExhaustedError" and "full" in str(err)
    short = batch_outcomes(resp, 3)
    assert all(isinstance(o, DelayqError) and "2 results for 3" in str(o) for o in short)
