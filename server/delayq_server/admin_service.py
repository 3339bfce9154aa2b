"""AdminService: create, list and revoke API tokens (issue 9)."""

from __future__ import annotations

from typing import Any

import grpc

from delayq.v1 import admin_pb2, admin_pb2_grpc
from delayq_server import convert, errors, validation
from delayq_server.admin.jobs import JobOps
from delayq_server.admin.queues import QueueOps
from delayq_server.admin.servicer import QueueAdminServicer
from delayq_server.auth import principal as pr
from delayq_server.auth import tokens
from delayq_server.errors import InvalidArgument, NotFound
from delayq_server.store.tokens import TokenRecord, TokenStore, TooManyTokens

Ctx = grpc.aio.ServicerContext[Any, Any]

MAX_DESCRIPTION = 256
MIN_TTL_MS, MAX_TTL_MS = 1_000, 3660 * 86_400_000

ROLE_NAMES: dict[int, str] = {
    admin_pb2.TOKEN_ROLE_PRODUCE: pr.PRODUCE,
    admin_pb2.TOKEN_ROLE_CONSUME: pr.CONSUME,
    admin_pb2.TOKEN_ROLE_READ: pr.READ,
    admin_pb2.TOKEN_ROLE_ADMIN: pr.ADMIN,
}
ROLE_ENUMS: dict[str, Any] = {v: k for k, v in ROLE_NAMES.items()}


class PermissionDenied(errors.DelayqError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(errors.DelayqError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


def info(rec: TokenRecord) -> admin_pb2.TokenInfo:
    out = admin_pb2.TokenInfo(
        token_id=rec.token_id,
        namespace=rec.namespace,
        roles=[ROLE_ENUMS[r] for r in rec.roles if r in ROLE_ENUMS],
        description=rec.description,
        create_time=convert.ts(rec.created_ms),
    )
    if rec.expires_ms:
        out.expire_time.CopyFrom(convert.ts(rec.expires_ms))
    return out


def _namespace(value: str) -> str:
    if value == pr.ALL_NAMESPACES:
        return value
    if not value:
        raise InvalidArgument("namespace", "required: a namespace name or '*' for every one")
    return validation.name("namespace", value)


def _roles(values: list[int]) -> tuple[str, ...]:
    if not values:
        raise InvalidArgument("roles", "give at least one role")
    out: list[str] = []
    for i, v in enumerate(values):
        role = ROLE_NAMES.get(v)
        if role is None:
            raise InvalidArgument(f"roles[{i}]", "must be PRODUCE, CONSUME, READ or ADMIN")
        if role not in out:
            out.append(role)
    return tuple(out)


class AdminService(QueueAdminServicer, admin_pb2_grpc.AdminServiceServicer):
    """Token management here, queue administration in QueueAdminServicer; the
    interceptor has checked roles already."""

    def __init__(
        self,
        store: TokenStore,
        authenticator: tokens.TokenAuthenticator | None,
        queue_ops: QueueOps,
        job_ops: JobOps,
    ) -> None:
        self._store = store
        self._auth = authenticator
        self.queue_ops = queue_ops
        self.job_ops = job_ops

    @errors.unary
    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Ctx
    ) -> admin_pb2.CreateTokenResponse:
        caller = pr.current()
        ns = _namespace(request.namespace)
        roles = _roles(list(request.roles))
        ttl_ms = 0
        if request.HasField("ttl"):
            ttl_ms = validation.duration_ms("ttl", request.ttl, lo=MIN_TTL_MS, hi=MAX_TTL_MS)
        if len(request.description) > MAX_DESCRIPTION:
            raise InvalidArgument("description", f"at most {MAX_DESCRIPTION} chars")
        # An admin of one namespace cannot mint a token that reaches further.
        if caller.namespace != pr.ALL_NAMESPACES and ns != caller.namespace:
            raise PermissionDenied(
                f"namespace: {caller.name} may only create tokens for {caller.namespace!r}"
            )
        token, token_id = tokens.generate()
        now = await self._store.time_ms()
        rec = TokenRecord(
            token_id=token_id,
            secret_hash=tokens.digest(token),
            namespace=ns,
            roles=roles,
            description=request.description,
            created_ms=now,
            expires_ms=now + ttl_ms if ttl_ms else 0,
        )
        try:
            await self._store.create(rec)
        except TooManyTokens:
            raise ResourceExhausted(
                "tokens: the store holds its maximum; revoke unused tokens, then retry"
            ) from None
        return admin_pb2.CreateTokenResponse(token=token, info=info(rec))

    @errors.unary
    async def ListTokens(
        self, request: admin_pb2.ListTokensRequest, context: Ctx
    ) -> admin_pb2.ListTokensResponse:
        caller = pr.current()
        wanted = _namespace(request.namespace) if request.namespace else ""
        recs = [
            r
            for r in await self._store.list()
            if (not wanted or r.namespace == wanted)
            and (caller.namespace == pr.ALL_NAMESPACES or r.namespace == caller.namespace)
        ]
        return admin_pb2.ListTokensResponse(tokens=[info(r) for r in recs])

    @errors.unary
    async def RevokeToken(
        self, request: admin_pb2.RevokeTokenRequest, context: Ctx
    ) -> admin_pb2.RevokeTokenResponse:
        caller = pr.current()
        if not tokens.TOKEN_ID.match(request.token_id):
            raise InvalidArgument("token_id", "want the 16-hex-digit id that ListTokens shows")
        rec = await self._store.get(request.token_id)
        # Another namespace's token answers as a missing one: nothing leaks.
        if rec is None or not caller.allows(rec.namespace):
            raise NotFound(f"token_id: no token {request.token_id!r}")
        await self._store.revoke(request.token_id)
        if self._auth is not None:
            self._auth.forget(request.token_id)
        return admin_pb2.RevokeTokenResponse()
