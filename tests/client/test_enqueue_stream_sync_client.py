"""The blocking Client's EnqueueStream transport (the default once batching is on):
unary calls again for a server without the method, and a broken stream's batch failed
while the next batch opens a new stream (few messages from many threads:
test_batching.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pytest

from delayq import Batching, Client, DelayqError, UnavailableError
from tests.client.test_batching import BATCH, ENQUEUE, STREAM, SyncCounter
from tests.client.test_enqueue_stream_client import Proxy
from tests.support.servers import wait_until


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


@dataclass
class Proxied:
    """A started `ProxyThread` to the test's server and a counted channel to it."""

    proxy: ProxyThread
    raw: grpc.Channel
    channel: grpc.Channel
    counter: SyncCounter


@pytest.fixture
def proxied(target: str) -> Iterator[Callable[[bool], Proxied]]:
    """Starts a proxy (with or without EnqueueStream); stops and closes it after the test."""
    made: list[Proxied] = []

    def make(stream: bool) -> Proxied:
        proxy = ProxyThread(target, stream=stream)
        proxy.start()
        counter = SyncCounter()
        raw = grpc.insecure_channel(proxy.address)
        made.append(Proxied(proxy, raw, grpc.intercept_channel(raw, counter), counter))
        return made[-1]

    yield make
    for p in made:
        p.channel.close()
        p.proxy.stop()
        p.proxy.close()


def test_a_server_without_enqueue_stream_gets_unary_calls(
    proxied: Callable[[bool], Proxied],
) -> None:
    p = proxied(False)
    with Client(channel=p.channel, batching=Batching()) as client:
        with ThreadPoolExecutor(10) as pool:
            first = list(pool.map(lambda i: client.enqueue("sold", i), range(10)))
        assert client._stream is not None and client._stream.unsupported
        lone = client.enqueue("sold", 10)
        assert len({r.job_id for r in [*first, lone]}) == 11
        assert p.counter.calls[STREAM] == 1  # tried once, then calls only
        assert p.counter.calls[ENQUEUE] + p.counter.calls[BATCH] >= 2
        assert client.stats("sold").enqueued_total == 11  # stored once each


def test_a_stream_the_server_does_not_serve_is_never_opened_again(
    proxied: Callable[[bool], Proxied],
) -> None:
    # A sender that checked `unsupported` just before the reader set it reaches
    # send() after the refusal (the batcher sends several batches at once): it must
    # get the refusal again, not open a second stream (CI at 6b4f773 saw two).
    p = proxied(False)
    with Client(channel=p.channel, batching=Batching()) as client:
        client.enqueue("sold2", 0)
        stream = client._stream
        assert stream is not None and stream.unsupported
        with pytest.raises(DelayqError) as refused:
            stream.send([], timeout=5.0)
        assert refused.value.code == grpc.StatusCode.UNIMPLEMENTED
        assert p.counter.calls[STREAM] == 1


def test_a_broken_stream_fails_its_batch_and_the_next_batch_opens_a_new_one(
    proxied: Callable[[bool], Proxied],
) -> None:
    p = proxied(True)
    with Client(channel=p.channel, batching=Batching(), timeout=5.0, retry_deadline=0.0) as client:
        client.enqueue("sbroken", "before")
        assert client._stream is not None and client._stream._open is not None
        broken = client._stream._open
        p.proxy.stop()
        with pytest.raises(UnavailableError):
            client.enqueue("sbroken", "while down")  # no key: never re-sent
        p.proxy.start()
        # The channel reconnects in its own time (gRPC's connection backoff).
        grpc.channel_ready_future(p.raw).result(30)
        client.enqueue("sbroken", "after")
        assert p.counter.calls[STREAM] >= 2  # a new stream after the failed one
        assert client.stats("sbroken").enqueued_total == 2
        # grpc reads each stream's requests on a thread of its own, blocked until the
        # next message: an ended stream must release it, or each break leaks one.
        wait_until(broken.released.is_set, timeout=10)
