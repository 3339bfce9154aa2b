"""The blocking Client's gathered enqueues as messages on one EnqueueStream call.

The threaded twin of `_enqueue_stream.EnqueueStream` (same rules, docs/decisions.md,
"EnqueueStream"): the stream opens on the first batch, stays open, and opens again
after it fails; each batch waits for the answer with its `batch_id`; a server
without the method (UNIMPLEMENTED) turns the client back to unary calls. The
request side is a queue that grpc's own thread drains; one reader thread per
stream answers the batches.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import grpc

from delayq.errors import DeadlineExceededError, DelayqError, UnavailableError, from_rpc_error
from delayq.v1 import service_pb2, service_pb2_grpc

__all__ = ["ThreadEnqueueStream"]

_END = object()  # ends the request iterator: the client half-closes
# How long close() waits for the server to end a half-closed stream.
CLOSE_WAIT_S = 5.0


class _Open:
    """One EnqueueStream call and the batches waiting for its answers."""

    def __init__(self) -> None:
        self.requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.call: Any = None
        self.lock = threading.Lock()
        self.waiting: dict[int, concurrent.futures.Future[service_pb2.EnqueueStreamResponse]] = {}
        self.error: DelayqError | None = None  # set once, when the stream ended
        self.reader: threading.Thread | None = None
        #: Set once grpc's thread stopped reading `messages()` (it waits for a next one).
        self.released = threading.Event()

    def messages(self) -> Iterator[service_pb2.EnqueueStreamRequest]:
        try:
            yield from iter(self.requests.get, _END)
        finally:
            self.released.set()


class ThreadEnqueueStream:
    """Sends batches on one long-lived EnqueueStream; see the module docstring."""

    def __init__(
        self,
        stub: service_pb2_grpc.DelayQueueServiceStub,
        metadata: Sequence[tuple[str, str]] | None,
    ) -> None:
        self._stub = stub
        self._metadata = metadata
        self._lock = threading.Lock()
        self._open: _Open | None = None
        self._ids = itertools.count(1)
        # The server's UNIMPLEMENTED (it predates EnqueueStream), raised again by send().
        self._refusal: DelayqError | None = None

    @property
    def unsupported(self) -> bool:
        """Whether the server answered UNIMPLEMENTED: it predates EnqueueStream."""
        return self._refusal is not None

    def send(
        self, requests: list[service_pb2.EnqueueRequest], timeout: float
    ) -> service_pb2.EnqueueStreamResponse:
        """One batch's answer. Raises the stream's error (a DelayqError) when it ended
        before answering, DeadlineExceededError after `timeout` seconds (the batch may
        still be stored then, as after a unary call's deadline)."""
        st = self._stream()
        fut: concurrent.futures.Future[service_pb2.EnqueueStreamResponse] = (
            concurrent.futures.Future()
        )
        batch_id = next(self._ids)
        with st.lock:
            if st.error is not None:  # ended since _stream(): the next send opens anew
                raise type(st.error)(st.error.message, st.error.code)
            st.waiting[batch_id] = fut
        try:
            st.requests.put(service_pb2.EnqueueStreamRequest(batch_id=batch_id, requests=requests))
            try:
                return fut.result(timeout)
            except concurrent.futures.TimeoutError:
                raise DeadlineExceededError(
                    f"EnqueueStream batch took longer than {timeout} s"
                ) from None
        finally:
            with st.lock:
                st.waiting.pop(batch_id, None)

    def _stream(self) -> _Open:
        with self._lock:
            if self._refusal is not None:
                # A sender that saw `unsupported` still False can get here after the
                # refusal (the batcher sends several batches at once): never reopen.
                raise type(self._refusal)(self._refusal.message, self._refusal.code)
            st = self._open
            if st is None or st.error is not None:
                st = self._open = _Open()
                # No deadline: the stream lives as long as the client; each batch has its own.
                open_stream: Any = self._stub.EnqueueStream
                st.call = open_stream(st.messages(), metadata=self._metadata)
                st.reader = threading.Thread(
                    target=self._read, args=(st,), name="delayq-enqueue-stream", daemon=True
                )
                st.reader.start()
            return st

    def _read(self, st: _Open) -> None:
        err: DelayqError = UnavailableError("the server ended the EnqueueStream")
        try:
            for resp in st.call:
                with st.lock:
                    fut = st.waiting.get(resp.batch_id)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
        finally:
            # grpc's thread that reads `st.requests` waits for a next message: release it.
            st.requests.put(_END)
            if err.code == grpc.StatusCode.UNIMPLEMENTED:
                self._refusal = err  # before st.error: whoever sees the end sees why
            with st.lock:
                st.error = err
                waiting = list(st.waiting.values())
            for fut in waiting:
                if not fut.done():  # a copy per batch: one raised object, many tracebacks
                    fut.set_exception(type(err)(err.message, err.code))

    def close(self) -> None:
        """Half-closes the stream; waits for the server to end it, then cancels."""
        with self._lock:
            st, self._open = self._open, None
        if st is None:
            return
        st.requests.put(_END)
        assert st.reader is not None
        st.reader.join(CLOSE_WAIT_S)
        if st.reader.is_alive():
            st.call.cancel()
            st.reader.join()
