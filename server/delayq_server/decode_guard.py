"""Server interceptor that answers undecodable request bytes with INVALID_ARGUMENT.

grpc.aio decodes the request before any handler runs and reports a failure as
UNKNOWN "Unexpected <class 'DecodeError'>", naming an internal class. This
interceptor takes the decoding over so the caller gets a canonical status and a
message it can act on (DESIGN promise 5). It must come first in the
interceptor list: later ones (telemetry, auth) then see decoded requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

# grpc's type stubs describe sync handlers; the aio ones are typed loosely here.
Handler = Any
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[Handler]]
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


class DecodeGuard(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> Handler:
        handler: Handler = await continuation(details)
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
        return handler  # client-streaming RPCs: none in delayq
