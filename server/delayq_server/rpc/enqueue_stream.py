"""EnqueueStream: EnqueueBatch calls carried as messages on one long-lived stream.

A stream message costs grpc.aio about half of a unary call, on the server and on
the client (docs/decisions.md, "EnqueueStream"), so the Python AsyncClient sends the
batches it gathers from concurrent `enqueue` callers this way. Each message is
answered on its own, by `batch_id`, in the order batches finish; a refused batch is
answered with an error and the stream goes on, as later calls would after a failed
unary EnqueueBatch.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc

from delayq.v1 import service_pb2
from delayq_server import errors
from delayq_server.auth import principal
from delayq_server.rpc.base import Ctx
from delayq_server.rpc.enqueue import EnqueueRpcs, batch_size

# Batches of one stream being stored at once. More wait unread, so a client that
# sends faster than Redis stores is held back by HTTP/2 flow control, not by memory.
BATCHES_IN_FLIGHT = 8

# The response header that says the stream was accepted (proto: EnqueueStream).
ACCEPTED_KEY = "delayq-enqueue-stream"
_PERMISSION_DENIED = grpc.StatusCode.PERMISSION_DENIED.value[0]
_SHUTTING_DOWN = errors.Unavailable(
    "the server is shutting down: send the batches not answered on a new stream"
)


class EnqueueStreamRpcs(EnqueueRpcs):
    """Mixed into DelayQueueService."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._enqueue_readers: set[asyncio.Task[None]] = set()
        self._enqueue_closing = False

    def close_enqueue_streams(self) -> None:
        """Shutdown: every stream stops reading, answers the batches it read, and ends
        UNAVAILABLE, so a client sends the rest again on a new stream (to another
        replica) instead of the server holding its shutdown until the grace runs out."""
        self._enqueue_closing = True
        for reader in list(self._enqueue_readers):
            reader.cancel()

    async def EnqueueStream(
        self, requests: AsyncIterator[service_pb2.EnqueueStreamRequest], context: Ctx
    ) -> AsyncIterator[service_pb2.EnqueueStreamResponse]:
        if self._enqueue_closing:
            await errors.abort(context, _SHUTTING_DOWN)
        # Accepted: the client writes only after these headers, so a stream refused at
        # open (credentials, a server without the method) reaches it as its real status
        # rather than as a failed write (grpc.aio reports those as INTERNAL, grpc#36066).
        await context.send_initial_metadata(((ACCEPTED_KEY, "1"),))
        answers: asyncio.Queue[service_pb2.EnqueueStreamResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(BATCHES_IN_FLIGHT)
        failure: list[BaseException] = []

        async def answer(request: service_pb2.EnqueueStreamRequest) -> None:
            try:
                answers.put_nowait(await self._stream_batch(request, context))
            finally:
                slots.release()

        async def read() -> None:
            running: set[asyncio.Task[None]] = set()
            try:
                try:
                    async for request in requests:
                        await slots.acquire()
                        task = asyncio.create_task(answer(request))
                        running.add(task)
                        task.add_done_callback(running.discard)
                except asyncio.CancelledError:
                    if not self._enqueue_closing:
                        raise
                    failure.append(_SHUTTING_DOWN)
                # Half-closed by the client, or shutdown: answer every batch read, then end.
                while running:
                    try:
                        await asyncio.wait(running)
                    except asyncio.CancelledError:  # shutdown during the wait: keep waiting
                        if not self._enqueue_closing:
                            raise
            except BaseException as exc:  # an undecodable message aborts the stream
                failure.append(exc)
                raise
            finally:
                answers.put_nowait(None)

        reader = asyncio.create_task(read())
        self._enqueue_readers.add(reader)
        reader.add_done_callback(self._enqueue_readers.discard)
        try:
            while (response := await answers.get()) is not None:
                yield response
            if failure and isinstance(failure[0], errors.DelayqError):
                await errors.abort(context, failure[0])
            if failure:
                raise failure[0]
        finally:
            reader.cancel()

    async def _stream_batch(
        self, request: service_pb2.EnqueueStreamRequest, context: Ctx
    ) -> service_pb2.EnqueueStreamResponse:
        """One message's answer: per-job results, or the error a unary EnqueueBatch
        would have failed with (nothing stored)."""
        try:
            batch_size(len(request.requests))
            # The principal is set when the stream opened (auth/interceptor.py).
            refusal = principal.namespace_refusal(
                principal.current(), (job.namespace or "default" for job in request.requests)
            )
            if refusal is not None:
                return service_pb2.EnqueueStreamResponse(
                    batch_id=request.batch_id,
                    error=service_pb2.BatchError(code=_PERMISSION_DENIED, message=refusal),
                )
            results = await self._batch_results(request.requests, context, trace=False)
        except Exception as exc:
            code, message = errors.to_status(exc)
            return service_pb2.EnqueueStreamResponse(
                batch_id=request.batch_id,
                error=service_pb2.BatchError(code=code.value[0], message=message),
            )
        return service_pb2.EnqueueStreamResponse(
            batch_id=request.batch_id, results=cast(Any, results)
        )
