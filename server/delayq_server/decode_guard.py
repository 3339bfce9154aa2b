"""Method handlers that answer undecodable request bytes with INVALID_ARGUMENT.

grpc.aio decodes the request before any handler runs and reports a failure as
UNKNOWN "Unexpected <class 'DecodeError'>", naming an internal class. The
guarded handlers take the decoding over so the caller gets a canonical status
and a message it can act on (DESIGN promise 5). They are wrapped once, when
the services are registered (`guarded`), not per call in an interceptor: with
no interceptor at all (telemetry off) grpc.aio skips its per-call interceptor
chain, which cut unary Enqueue's server CPU (docs/decisions.md, issue 12).
With interceptors (telemetry, auth), the DecodeGuard interceptor does the same job
first in the chain, so they see decoded requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

# grpc's type stubs describe sync handlers; the aio ones are typed loosely here.
Handler = Any
Context = grpc.aio.ServicerContext[Any, Any]


def _type_name(deserializer: Callable[[bytes], Any]) -> str:
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "request message"))


async def _decode(deserializer: Callable[[bytes], Any], raw: bytes, context: Context) -> Any:
    try:
        return deserializer(raw)
    except Exception:
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request: the bytes are not a valid {_type_name(deserializer)} "
            "(protobuf decoding failed); send a message built from delayq's .proto files",
        )


def guard(handler: Handler) -> Handler:
    """The same method handler, decoding its request itself (None passes through)."""
    if handler is None or handler.request_deserializer is None:
        return handler
    deserializer = handler.request_deserializer
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(raw: bytes, context: Context) -> Any:
            return await unary(await _decode(deserializer, raw, context), context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, response_serializer=handler.response_serializer
        )
    if handler.unary_stream is not None:
        stream = handler.unary_stream

        async def unary_stream(raw: bytes, context: Context) -> AsyncIterator[Any]:
            request = await _decode(deserializer, raw, context)
            async for item in stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, response_serializer=handler.response_serializer
        )
    if handler.stream_stream is not None:  # EnqueueStream: each message decoded here
        streams = handler.stream_stream

        async def stream_stream(raws: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
            async def decoded() -> AsyncIterator[Any]:
                async for raw in raws:
                    yield await _decode(deserializer, raw, context)

            async for item in streams(decoded(), context):
                yield item

        return grpc.stream_stream_rpc_method_handler(
            stream_stream, response_serializer=handler.response_serializer
        )
    return handler  # client-streaming RPCs with one response: none in delayq


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """The same guard as an interceptor, for a server that runs interceptors
    (auth, telemetry) that must see decoded requests: it must come first."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: Any
    ) -> Handler:
        return guard(await continuation(details))


class _GuardedGeneric(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """A generic handler whose method handlers are guarded, each wrapped once."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._cache: dict[str, Handler] = {}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Handler:
        method: str = handler_call_details.method
        if method not in self._cache:
            self._cache[method] = guard(self._inner.service(handler_call_details))
        return self._cache[method]


class Guarded:
    """Stands in for the server while a generated `add_*_to_server` (or reflection)
    registers its handlers: every handler reaches the server guarded."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._server.add_generic_rpc_handlers(tuple(_GuardedGeneric(h) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Handler]) -> None:
        # Present on grpc.aio servers (grpcio >= 1.63) though the type stubs lack it.
        self._server.add_registered_method_handlers(  # type: ignore[attr-defined]
            service, {method: guard(h) for method, h in handlers.items()}
        )


def guarded(server: grpc.aio.Server) -> Any:
    """`server` as generated registration code sees it, guarding every handler."""
    return Guarded(server)
