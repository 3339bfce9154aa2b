"""The AsyncClient's EnqueueStream transport (the default for gathered enqueues): few
messages on one stream, unary calls again for a server without the method, a broken
stream's batches failed or re-sent, and each caller's trace context in its own job."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from delayq import AsyncClient, Batching, DelayqError, UnavailableError
from delayq._channel import channel_options
from delayq._enqueue_stream import ACCEPTED_KEY, EnqueueStream
from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import free_port

SERVICE = "delayq.v1.DelayQueueService"
STREAM = f"/{SERVICE}/EnqueueStream"


class _UnaryCount(aio.UnaryUnaryClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, calls: collections.Counter[str]) -> None:
        self.calls = calls

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        self.calls[_name(details)] += 1
        return await continuation(details, request)


class _StreamCount(aio.StreamStreamClientInterceptor):  # type: ignore[type-arg]
    def __init__(self, calls: collections.Counter[str]) -> None:
        self.calls = calls

    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        self.calls[_name(details)] += 1
        return await continuation(details, requests)


def _name(details: Any) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class Calls:
    """Counts the calls a channel starts, unary and streaming, by method (grpc.aio files
    an interceptor under its first kind only, so one object per kind)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()
        self.interceptors: list[Any] = [_UnaryCount(self.calls), _StreamCount(self.calls)]


class Sent:
    """Records the batches a client's EnqueueStream sends and what each got back."""

    def __init__(self, stream: EnqueueStream) -> None:
        self.sizes: list[int] = []
        self.errors: list[BaseException] = []
        self.failed = asyncio.Event()
        self.active = self.most = 0  # batches sent and not yet answered
        inner = stream.send

        async def send(requests: list[service_pb2.EnqueueRequest], timeout: float) -> Any:  # noqa: ASYNC109
            self.sizes.append(len(requests))
            self.active += 1
            self.most = max(self.most, self.active)
            try:
                return await inner(requests, timeout)
            except BaseException as exc:
                self.errors.append(exc)
                self.failed.set()
                raise
            finally:
                self.active -= 1

        stream.send = send  # type: ignore[method-assign]


def sent(client: AsyncClient) -> Sent:
    assert client._stream is not None
    return Sent(client._stream)


async def test_concurrent_enqueues_travel_as_few_messages_on_one_stream(target: str) -> None:
    calls = Calls()
    channel = aio.insecure_channel(
        target, options=channel_options(), interceptors=calls.interceptors
    )
    async with AsyncClient(channel=channel) as client:
        spy = sent(client)
        results = await asyncio.gather(*(client.enqueue("sq", {"n": i}) for i in range(200)))
        assert len({r.job_id for r in results}) == 200
        # 200 calls started in one loop turn: spread over the 4 slots (25 or more each).
        assert spy.sizes == [50, 50, 50, 50]
        for i in range(3):  # a lone job later goes on the same stream, at once
            await client.enqueue("sq", {"n": 200 + i})
        assert spy.sizes[4:] == [1, 1, 1]
        assert calls.calls == {STREAM: 1}, calls.calls  # no unary Enqueue or EnqueueBatch
        assert (await client.stats("sq")).enqueued_total == 203
        jobs = await asyncio.gather(*(client.get("sq", r.job_id) for r in results[:3]))
        assert [j.payload for j in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]
    await channel.close(None)


async def test_busy_callers_keep_several_batches_on_the_stream(target: str) -> None:
    settings = Batching(max_in_flight=3)
    async with AsyncClient(target, batching=settings) as client:
        spy = sent(client)

        async def caller(n: int) -> None:
            for i in range(20):
                await client.enqueue("busy", {"caller": n, "i": i})

        await asyncio.gather(*(caller(n) for n in range(50)))
        assert (await client.stats("busy")).enqueued_total == 1000
        assert sum(spy.sizes) == 1000
        assert len(spy.sizes) < 1000 / 5  # gathered, not one message per job
        assert 2 <= spy.most <= settings.max_in_flight


# -- a proxy in front of the real server: without EnqueueStream, or stopped and started --


class Proxy:
    """A grpc.aio server forwarding Enqueue, EnqueueBatch, GetQueueStats and Query to
    the real server, and EnqueueStream too when `stream` (each message as an
    EnqueueBatch): without it the server answers UNIMPLEMENTED, as one that predates
    the method does."""

    def __init__(self, target: str, *, stream: bool) -> None:
        self.target, self.stream = target, stream
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server: aio.Server | None = None
        self.channel: aio.Channel | None = None

    async def start(self) -> None:
        self.channel = aio.insecure_channel(self.target)
        real = service_pb2_grpc.DelayQueueServiceStub(self.channel)

        def forward(method: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def call(request: Any, context: Any) -> Any:
                return await method(request, timeout=10)

            return call

        async def enqueue_stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            await context.send_initial_metadata(((ACCEPTED_KEY, "1"),))  # as the contract says
            async for m in requests:
                batch = await real.EnqueueBatch(
                    service_pb2.EnqueueBatchRequest(requests=m.requests), timeout=10
                )
                yield service_pb2.EnqueueStreamResponse(batch_id=m.batch_id, results=batch.results)

        pb = service_pb2
        handlers: dict[str, Any] = {
            name: grpc.unary_unary_rpc_method_handler(
                forward(getattr(real, name)),
                request_deserializer=req.FromString,
                response_serializer=resp.SerializeToString,
            )
            for name, req, resp in (
                ("Enqueue", pb.EnqueueRequest, pb.EnqueueResponse),
                ("EnqueueBatch", pb.EnqueueBatchRequest, pb.EnqueueBatchResponse),
                ("GetQueueStats", pb.GetQueueStatsRequest, pb.GetQueueStatsResponse),
                ("Query", pb.QueryRequest, pb.QueryResponse),
            )
        }
        if self.stream:
            handlers["EnqueueStream"] = grpc.stream_stream_rpc_method_handler(
                enqueue_stream,
                request_deserializer=pb.EnqueueStreamRequest.FromString,
                response_serializer=pb.EnqueueStreamResponse.SerializeToString,
            )
        self.server = aio.server()
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self.server.add_insecure_port(self.address)
        await self.server.start()

    async def stop(self) -> None:
        assert self.server is not None and self.channel is not None
        await self.server.stop(0)
        await self.channel.close(None)


@contextlib.asynccontextmanager
async def unserved(target: str) -> AsyncIterator[tuple[aio.Channel, Calls]]:
    """A counted channel to a proxy of the test's server that lacks EnqueueStream."""
    proxy = Proxy(target, stream=False)
    await proxy.start()
    calls = Calls()
    channel = aio.insecure_channel(proxy.address, interceptors=calls.interceptors)
    try:
        yield channel, calls
    finally:
        await channel.close(None)
        await proxy.stop()


async def test_a_server_without_enqueue_stream_gets_unary_calls(target: str) -> None:
    async with unserved(target) as (channel, calls), AsyncClient(channel=channel) as client:
        spy = sent(client)
        first = await asyncio.gather(*(client.enqueue("old", i) for i in range(10)))
        assert client._stream is not None and client._stream.unsupported
        lone = await client.enqueue("old", 10)
        assert len({r.job_id for r in [*first, lone]}) == 11
        assert spy.sizes == [10]  # tried once, then calls only
        assert calls.calls[STREAM] == 1
        assert calls.calls[f"/{SERVICE}/EnqueueBatch"] == 1
        assert calls.calls[f"/{SERVICE}/Enqueue"] == 1
        assert (await client.stats("old")).enqueued_total == 11  # stored once each


async def test_a_stream_the_server_does_not_serve_is_never_opened_again(target: str) -> None:
    # The twin of the blocking client's test: after UNIMPLEMENTED, send() answers
    # the refusal again instead of opening a second stream.
    async with unserved(target) as (channel, calls), AsyncClient(channel=channel) as client:
        await client.enqueue("old2", 0)
        stream = client._stream
        assert stream is not None and stream.unsupported
        with pytest.raises(DelayqError) as refused:
            await stream.send([], timeout=5.0)
        assert refused.value.code == grpc.StatusCode.UNIMPLEMENTED
        assert calls.calls[STREAM] == 1


async def test_a_broken_stream_fails_its_batch_and_the_next_batch_opens_a_new_one(
    target: str,
) -> None:
    proxy = Proxy(target, stream=True)
    await proxy.start()
    calls = Calls()
    channel = aio.insecure_channel(proxy.address, interceptors=calls.interceptors)
    try:
        async with AsyncClient(channel=channel, timeout=5.0, retry_deadline=0.0) as client:
            await client.enqueue("broken", "before")
            await proxy.stop()
            with pytest.raises(UnavailableError):
                await client.enqueue("broken", "while down")  # no key: never re-sent
            await proxy.start()
            # The channel reconnects in its own time (gRPC's connection backoff); a call
            # before that fails UNAVAILABLE on a unary call just the same.
            await asyncio.wait_for(channel.channel_ready(), 30)
            await client.enqueue("broken", "after")
            assert calls.calls[STREAM] >= 2  # a new stream after the failed one
            assert (await client.stats("broken")).enqueued_total == 2
    finally:
        await channel.close(None)
        await proxy.stop()


async def test_batches_with_idempotency_keys_are_resent_on_a_new_stream(target: str) -> None:
    proxy = Proxy(target, stream=True)
    await proxy.start()
    channel = aio.insecure_channel(proxy.address)
    try:
        async with AsyncClient(channel=channel, retry_deadline=60.0) as client:
            await client.enqueue("resent", "warm", idempotency_key="w")
            await proxy.stop()
            spy = sent(client)
            task = asyncio.ensure_future(
                asyncio.gather(
                    *(client.enqueue("resent", i, idempotency_key=f"k{i}") for i in range(5))
                )
            )
            await asyncio.wait_for(spy.failed.wait(), 30)  # the first attempt failed
            assert not task.done()  # and is waiting to be sent again
            await proxy.start()
            results = await asyncio.wait_for(task, 60)
            assert len({r.job_id for r in results}) == 5
            assert all(isinstance(e, UnavailableError) for e in spy.errors)
            assert (await client.stats("resent")).enqueued_total == 6
    finally:
        await channel.close(None)
        await proxy.stop()


# -- trace context ------------------------------------------------------------------------


def _span(trace_id: int) -> NonRecordingSpan:
    return NonRecordingSpan(
        SpanContext(trace_id=trace_id, span_id=0xABC, is_remote=False, trace_flags=TraceFlags(1))
    )


async def test_each_caller_stores_its_own_trace_context_in_its_job(target: str) -> None:
    async with AsyncClient(target) as client:

        async def produce(trace_id: int) -> str:
            with trace.use_span(_span(trace_id)):
                return (await client.enqueue("traced", trace_id)).job_id

        ids = await asyncio.gather(*(produce(t) for t in (0x1111, 0x2222, 0x3333)))
        own = "00-" + "4" * 32 + "-" + "5" * 16 + "-01"
        with trace.use_span(_span(0x6666)):
            mine = (await client.enqueue("traced", 0, headers={"traceparent": own})).job_id
        plain = (await client.enqueue("traced", 1)).job_id  # no span current
        jobs = await asyncio.gather(*(client.get("traced", i) for i in [*ids, mine, plain]))
    for job, trace_id in zip(jobs, (0x1111, 0x2222, 0x3333), strict=False):
        assert job.headers["traceparent"] == f"00-{trace_id:032x}-{0xABC:016x}-01"
    assert jobs[3].headers["traceparent"] == own  # the caller's own header wins
    assert "traceparent" not in jobs[4].headers
