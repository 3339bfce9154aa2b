"""The blocking Client's EnqueueStream transport (the default once batching is on): few
messages on one stream from many threads, unary calls again for a server without the
method, and a broken stream's batch failed while the next batch opens a new stream."""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from delayq import (
    Batching,
    Client,
    DelayqError,
    EnqueueResult,
    InvalidArgumentError,
    UnavailableError,
)
from delayq._channel import channel_options
from tests.client.test_enqueue_stream_client import SERVICE, STREAM, Proxy

ENQUEUE, BATCH = f"/{SERVICE}/Enqueue", f"/{SERVICE}/EnqueueBatch"


class Counter(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[type-arg]
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


def test_threads_enqueue_as_few_messages_on_one_stream(target: str) -> None:
    counter = Counter()
    channel = grpc.intercept_channel(
        grpc.insecure_channel(target, options=channel_options()), counter
    )
    client = Client(channel=channel, batching=Batching(max_delay=0.05))
    start = threading.Barrier(32)

    def one(i: int) -> EnqueueResult | DelayqError:
        start.wait()
        try:
            return client.enqueue("stq" if i % 8 else "bad:q", i)
        except DelayqError as err:
            return err

    with ThreadPoolExecutor(32) as pool:
        outcomes = list(pool.map(one, range(32)))
    client.close()
    refused = [i for i, o in enumerate(outcomes) if isinstance(o, InvalidArgumentError)]
    assert refused == [0, 8, 16, 24]
    assert all(isinstance(o, EnqueueResult) for i, o in enumerate(outcomes) if i % 8)
    assert counter.calls == {STREAM: 1}, counter.calls  # no unary Enqueue or EnqueueBatch
    assert 1 <= counter.messages < 16
    with Client(target) as plain:
        assert plain.stats("stq").enqueued_total == 28
    channel.close()


class ProxyThread:
    """The asyncio `Proxy` run on a loop of its own, for blocking tests."""

    def __init__(self, target: str, *, stream: bool) -> None:
        self.proxy = Proxy(target, stream=stream)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return self.proxy.address

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.stop(), self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def proxies() -> Iterator[list[ProxyThread]]:
    made: list[ProxyThread] = []
    yield made
    for p in made:
        p.close()


def test_a_server_without_enqueue_stream_gets_unary_calls(
    target: str, proxies: list[ProxyThread]
) -> None:
    proxy = ProxyThread(target, stream=False)
    proxies.append(proxy)
    proxy.start()
    counter = Counter()
    channel = grpc.intercept_channel(grpc.insecure_channel(proxy.address), counter)
    try:
        with Client(channel=channel, batching=Batching()) as client:
            with ThreadPoolExecutor(10) as pool:
                first = list(pool.map(lambda i: client.enqueue("sold", i), range(10)))
            assert client._stream is not None and client._stream.unsupported
            lone = client.enqueue("sold", 10)
            assert len({r.job_id for r in [*first, lone]}) == 11
            assert counter.calls[STREAM] == 1  # tried once, then calls only
            assert counter.calls[ENQUEUE] + counter.calls[BATCH] >= 2
            assert client.stats("sold").enqueued_total == 11  # stored once each
    finally:
        channel.close()
        proxy.stop()


def test_a_broken_stream_fails_its_batch_and_the_next_batch_opens_a_new_one(
    target: str, proxies: list[ProxyThread]
) -> None:
    proxy = ProxyThread(target, stream=True)
    proxies.append(proxy)
    proxy.start()
    counter = Counter()
    raw = grpc.insecure_channel(proxy.address)
    channel = grpc.intercept_channel(raw, counter)
    try:
        with Client(
            channel=channel, batching=Batching(), timeout=5.0, retry_deadline=0.0
        ) as client:
            client.enqueue("sbroken", "before")
            proxy.stop()
            with pytest.raises(UnavailableError):
                client.enqueue("sbroken", "while down")  # no key: never re-sent
            proxy.start()
            # The channel reconnects in its own time (gRPC's connection backoff).
            grpc.channel_ready_future(raw).result(30)
            client.enqueue("sbroken", "after")
            assert counter.calls[STREAM] >= 2  # a new stream after the failed one
            assert client.stats("sbroken").enqueued_total == 2
    finally:
        channel.close()
        proxy.stop()
