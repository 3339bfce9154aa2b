"""The auth interceptor: every RPC is authenticated and authorized here, before its handler.

Modelled on grpc's examples/python/auth: the interceptor wraps each method
handler, so the check runs with the decoded request in hand (the namespace
is in the request, or inside the lease token) and before the servicer, and
therefore before any job key in Redis is touched. Failures map to
UNAUTHENTICATED (who are you?) and PERMISSION_DENIED (not yours) here and
nowhere else. A lease token of another namespace answers NOT_FOUND (UNKNOWN
per token for Ack), exactly as an unknown job does, so nothing leaks.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from delayq.v1 import service_pb2
from delayq_server import ids
from delayq_server.auth import principal as pr
from delayq_server.auth.certs import CertRoles
from delayq_server.auth.rules import Rule, Scope, rule_for
from delayq_server.auth.tokens import TokenAuthenticator

log = logging.getLogger(__name__)

Ctx = grpc.aio.ServicerContext[Any, Any]
if TYPE_CHECKING:  # generic only in the type stubs
    Handler = grpc.RpcMethodHandler[Any, Any]

# Same text as an unknown lease token gets from the servicer (errors.py).
LEASE_NOT_FOUND = "lease_token: no such job (acked, deleted or expired)"
_MAX_TOKENS = 1000  # more is refused by validation as a whole
_RESPONSES: dict[str, Any] = {
    "delayq.v1.AckRequest": service_pb2.AckResponse,
    "delayq.v1.ReleaseRequest": service_pb2.ReleaseResponse,
}


class Denied(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _bearer(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Denied(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "authorization: want 'Bearer <token>' metadata",
                )
            return token.strip()
    return None


def _lease_namespaces(request: Any) -> list[str]:
    """Namespaces named by the well-formed lease tokens of a request."""
    tokens: list[str] = []
    fields = {f.name for f in request.DESCRIPTOR.fields}
    if "lease_token" in fields:
        tokens.append(request.lease_token)
    if "lease_tokens" in fields:
        tokens.extend(request.lease_tokens)
    out = []
    for t in tokens:
        parsed = ids.parse_token(t)
        if parsed is not None:  # malformed ones are the servicer's INVALID_ARGUMENT
            out.append(parsed.keys.namespace)
    return out


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Authenticates by bearer token (or mapped client certificate), then checks role
    and namespace."""

    def __init__(self, tokens: TokenAuthenticator, certs: CertRoles | None = None) -> None:
        self._tokens = tokens
        self._certs = certs

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        rule = rule_for(method)
        if handler is None or rule is None:
            return handler
        metadata = handler_call_details.invocation_metadata
        name = method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return self._unary(handler, rule, name, metadata)
        if handler.unary_stream is not None:
            return self._unary_stream(handler, rule, name, metadata)
        if handler.stream_stream is not None and rule.scope is Scope.SERVICER:
            return self._stream_stream(handler, rule, name, metadata)
        # No other client-streaming RPCs exist; refuse rather than pass one unchecked.
        return grpc.stream_unary_rpc_method_handler(self._refuse_streaming)

    @staticmethod
    async def _refuse_streaming(request_iterator: Any, context: Ctx) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "client streaming is not supported")

    def _unary(self, handler: Handler, rule: Rule, name: str, metadata: Any) -> Handler:
        inner: Any = handler.unary_unary

        async def call(request: Any, context: Ctx) -> Any:
            try:
                p = await self._authenticate(metadata, context)
                self._authorize(p, rule, name, request)
                if rule.scope is Scope.PER_TOKEN:
                    return await self._per_token(p, request, context, inner)
            except Denied as d:
                await context.abort(d.code, d.message)
            pr.set_current(p)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _unary_stream(self, handler: Handler, rule: Rule, name: str, metadata: Any) -> Handler:
        inner: Any = handler.unary_stream

        async def call(request: Any, context: Ctx) -> AsyncIterator[Any]:
            try:
                p = await self._authenticate(metadata, context)
                self._authorize(p, rule, name, request)
            except Denied as d:
                await context.abort(d.code, d.message)
            pr.set_current(p)
            async for item in inner(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _stream_stream(self, handler: Handler, rule: Rule, name: str, metadata: Any) -> Handler:
        """EnqueueStream: credentials and role are checked when the stream opens; the
        servicer checks each message's namespaces against the principal (rules.py)."""
        inner: Any = handler.stream_stream

        async def call(requests: AsyncIterator[Any], context: Ctx) -> AsyncIterator[Any]:
            try:
                p = await self._authenticate(metadata, context)
                self._authorize(p, rule, name, None)
            except Denied as d:
                await context.abort(d.code, d.message)
            pr.set_current(p)
            async for item in inner(requests, context):
                yield item

        return grpc.stream_stream_rpc_method_handler(
            call,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def _authenticate(self, metadata: Any, context: Ctx) -> pr.Principal:
        token = _bearer(metadata)
        if token is not None:
            p = await self._tokens.authenticate(token)
            if p is None:
                raise Denied(grpc.StatusCode.UNAUTHENTICATED, "unknown, expired or revoked token")
            return p
        if self._certs is not None:
            p = self._certs.lookup(context.auth_context())
            if p is not None:
                return p
        raise Denied(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing credentials: send 'authorization: Bearer <token>' metadata"
            + (" or a mapped client certificate" if self._certs is not None else ""),
        )

    @staticmethod
    def _authorize(p: pr.Principal, rule: Rule, name: str, request: Any) -> None:
        if not p.has(rule.role):
            raise Denied(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{p.name} lacks the {rule.role} role that {name} needs",
            )
        if rule.scope is Scope.ALL and p.namespace != pr.ALL_NAMESPACES:
            raise Denied(
                grpc.StatusCode.PERMISSION_DENIED, f"{name} needs a token for every namespace"
            )
        wanted: list[str] = []
        if rule.scope is Scope.NAMESPACE:
            wanted = [request.namespace or "default"]
        elif rule.scope is Scope.BATCH:
            wanted = [r.namespace or "default" for r in request.requests]
        elif rule.scope is Scope.LEASE and not all(
            p.allows(ns) for ns in _lease_namespaces(request)
        ):
            raise Denied(grpc.StatusCode.NOT_FOUND, LEASE_NOT_FOUND)
        refusal = pr.namespace_refusal(p, wanted)
        if refusal is not None:
            raise Denied(grpc.StatusCode.PERMISSION_DENIED, refusal)

    @staticmethod
    async def _per_token(
        p: pr.Principal,
        request: Any,
        context: Ctx,
        inner: Callable[..., Awaitable[Any]],
    ) -> Any:
        """Ack and Release: tokens of other namespaces answer UNKNOWN, as unknown jobs do,
        without reaching the servicer; the others go through in one call."""
        tokens = list(request.lease_tokens)
        foreign = set()
        if len(tokens) <= _MAX_TOKENS:  # more: the servicer refuses the whole call
            for i, t in enumerate(tokens):
                parsed = ids.parse_token(t)
                if parsed is not None and not p.allows(parsed.keys.namespace):
                    foreign.add(i)
        pr.set_current(p)
        if not foreign:
            return await inner(request, context)
        response_type = _RESPONSES[type(request).DESCRIPTOR.full_name]
        enum = response_type.DESCRIPTOR.fields_by_name["results"].enum_type
        unknown = next(v.number for v in enum.values if v.name.endswith("_UNKNOWN"))
        results = [unknown] * len(tokens)
        kept = [i for i in range(len(tokens)) if i not in foreign]
        if kept:
            resp = await inner(type(request)(lease_tokens=[tokens[i] for i in kept]), context)
            for i, r in zip(kept, resp.results, strict=True):
                results[i] = r
        return response_type(results=results)
