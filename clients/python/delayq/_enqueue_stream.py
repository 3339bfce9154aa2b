"""The AsyncClient's gathered enqueues as messages on one EnqueueStream call.

A message on an open stream costs grpc.aio about half of a unary call, on the
client and on the server (docs/decisions.md, "EnqueueStream"), so the batches the
AsyncBatcher forms go this way. The stream opens on the first batch, stays open,
and is opened again after it fails; each batch waits for the answer with its
`batch_id`. A server without the method (UNIMPLEMENTED) turns the client back to
unary Enqueue and EnqueueBatch calls.
"""

# `timeout` is each batch's own wait, named as the client's calls name theirs.
# ruff: noqa: ASYNC109

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Sequence
from typing import Any

import grpc

from delayq.errors import DeadlineExceededError, DelayqError, UnavailableError, from_rpc_error
from delayq.v1 import service_pb2, service_pb2_grpc

__all__ = ["EnqueueStream"]

# What grpc.aio sets as the call's status when a message cannot be sent (_call.py).
_CORE_WRITE_FAILURE = "Internal error from Core"
# The server's response header when it accepts the stream (proto: EnqueueStream).
ACCEPTED_KEY = "delayq-enqueue-stream"


class _Open:
    """One EnqueueStream call and the batches waiting for its answers."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.waiting: dict[int, asyncio.Future[service_pb2.EnqueueStreamResponse]] = {}
        self.error: DelayqError | None = None
        self.ended = asyncio.Event()  # the reader has set `error`
        self.accepted: asyncio.Task[bool] | None = None
        # grpc.aio takes one write at a time per call (a second raises UsageError).
        self.writing = asyncio.Lock()


class EnqueueStream:
    """Sends batches on one long-lived EnqueueStream; see the module docstring."""

    def __init__(
        self,
        stub: service_pb2_grpc.DelayQueueServiceStub,
        metadata: Sequence[tuple[str, str]] | None,
    ) -> None:
        self._stub = stub
        self._metadata = metadata
        self._open: _Open | None = None
        self._ids = itertools.count(1)
        self._readers: set[asyncio.Task[None]] = set()
        # The server's UNIMPLEMENTED (it predates EnqueueStream), raised again by send().
        self._refusal: DelayqError | None = None

    @property
    def unsupported(self) -> bool:
        """Whether the server answered UNIMPLEMENTED: it predates EnqueueStream."""
        return self._refusal is not None

    async def send(
        self, requests: list[service_pb2.EnqueueRequest], timeout: float
    ) -> service_pb2.EnqueueStreamResponse:
        """One batch's answer. Raises the stream's error (a DelayqError) when it
        failed before answering, DeadlineExceededError after `timeout` seconds (the
        batch may still be stored then, as after a unary call's deadline)."""
        st = self._stream()
        assert st.accepted is not None
        if not st.accepted.done():
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(st.accepted)
            except TimeoutError:
                raise DeadlineExceededError(
                    f"EnqueueStream not accepted within {timeout} s"
                ) from None
        if not st.accepted.result():  # refused at open: the reader has its real status
            await st.ended.wait()
            assert st.error is not None
            raise type(st.error)(st.error.message, st.error.code)
        batch_id = next(self._ids)
        fut: asyncio.Future[service_pb2.EnqueueStreamResponse] = (
            asyncio.get_running_loop().create_future()
        )
        st.waiting[batch_id] = fut
        try:
            try:
                message = service_pb2.EnqueueStreamRequest(batch_id=batch_id, requests=requests)
                async with st.writing:
                    await st.call.write(message)
            except Exception:
                # The stream ended under us: its reader answers with the stream's error.
                if not fut.done():
                    await asyncio.wait((fut,), timeout=timeout)
                if not fut.done():
                    raise st.error or UnavailableError(
                        "EnqueueStream closed before the batch was sent"
                    ) from None
            try:
                async with asyncio.timeout(timeout):
                    return await fut
            except TimeoutError:
                raise DeadlineExceededError(
                    f"EnqueueStream batch took longer than {timeout} s"
                ) from None
        finally:
            st.waiting.pop(batch_id, None)

    def _stream(self) -> _Open:
        if self._refusal is not None:
            # A caller that saw `unsupported` still False can get here after the
            # refusal (several batches are in flight at once): never reopen.
            raise type(self._refusal)(self._refusal.message, self._refusal.code)
        st = self._open
        if st is None or st.error is not None:
            # No deadline: the stream lives as long as the client; each batch has its own.
            open_stream: Any = self._stub.EnqueueStream  # grpc.aio: the stubs are typed sync
            st = self._open = _Open(open_stream(metadata=self._metadata))
            loop = asyncio.get_running_loop()
            st.accepted = loop.create_task(self._accepted(st))
            reader = loop.create_task(self._read(st))
            self._readers.add(reader)
            reader.add_done_callback(self._readers.discard)
        return st

    @staticmethod
    async def _accepted(st: _Open) -> bool:
        """Whether the server accepted the stream: its `delayq-enqueue-stream` response
        header came. Writing before it would turn a refusal at open (UNAUTHENTICATED,
        UNIMPLEMENTED) into grpc.aio's INTERNAL for a failed write (grpc#36066)."""
        try:
            headers = await st.call.initial_metadata()
        except Exception:  # the call failed: the reader has the status
            return False
        return any(key == ACCEPTED_KEY for key, _ in headers or ())

    async def _read(self, st: _Open) -> None:
        err: DelayqError = UnavailableError("the client closed the EnqueueStream")
        try:
            async for resp in st.call:
                fut = st.waiting.get(resp.batch_id)
                if fut is not None and not fut.done():
                    fut.set_result(resp)
            err = UnavailableError("the server ended the EnqueueStream")
        except grpc.RpcError as exc:
            err = from_rpc_error(exc)
            if err.code == grpc.StatusCode.INTERNAL and err.message == _CORE_WRITE_FAILURE:
                # grpc.aio's own status for a write on a call whose connection failed
                # (the server never said so): the transport broke, as UNAVAILABLE says.
                err = UnavailableError(f"EnqueueStream broke: {err.message}")
        finally:
            st.error = err
            st.ended.set()
            if err.code == grpc.StatusCode.UNIMPLEMENTED:
                self._refusal = err
            for fut in st.waiting.values():
                if not fut.done():  # a copy per batch: one raised object, many tracebacks
                    fut.set_exception(type(err)(err.message, err.code))

    async def close(self) -> None:
        """Half-closes the stream once its batches are answered; the server then ends it."""
        st, self._open = self._open, None
        if st is not None and st.error is None:
            with contextlib.suppress(Exception):  # already ended: the reader has the error
                await st.call.done_writing()
        if self._readers:
            await asyncio.wait(list(self._readers), timeout=5)
        for reader in list(self._readers):
            reader.cancel()
