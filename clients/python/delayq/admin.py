"""Blocking client of AdminService: API tokens (create, list, revoke)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import grpc

from delayq import _convert
from delayq._channel import auth_metadata, channel_options, resolve_target
from delayq.admin_queues import QueueAdminMixin
from delayq.errors import from_rpc_error
from delayq.v1 import admin_pb2, admin_pb2_grpc

__all__ = ["ROLES", "AdminClient", "TokenInfo"]

#: Role names as the CLI and `create_token` take them.
ROLES = {
    "produce": admin_pb2.TOKEN_ROLE_PRODUCE,
    "consume": admin_pb2.TOKEN_ROLE_CONSUME,
    "read": admin_pb2.TOKEN_ROLE_READ,
    "admin": admin_pb2.TOKEN_ROLE_ADMIN,
}
_NAMES = {v: k for k, v in ROLES.items()}


@dataclass(frozen=True)
class TokenInfo:
    """A token as ListTokens shows it: never the secret."""

    token_id: str
    namespace: str
    roles: tuple[str, ...]
    description: str
    create_time: datetime | None
    expire_time: datetime | None

    @classmethod
    def from_proto(cls, m: admin_pb2.TokenInfo) -> TokenInfo:
        return cls(
            token_id=m.token_id,
            namespace=m.namespace,
            roles=tuple(_NAMES.get(r, str(r)) for r in m.roles),
            description=m.description,
            create_time=_convert.from_timestamp(m.create_time)
            if m.HasField("create_time")
            else None,
            expire_time=_convert.from_timestamp(m.expire_time)
            if m.HasField("expire_time")
            else None,
        )


class AdminClient(QueueAdminMixin):
    """Token management and queue administration (admin_queues.py); needs a token
    with the admin role (`token=` or $DELAYQ_TOKEN), or the read role for listings."""

    def __init__(
        self,
        target: str | None = None,
        *,
        token: str | None = None,
        namespace: str = "",
        timeout: float = 10.0,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        target = resolve_target(target)
        opts = channel_options(options)
        self._channel = (
            grpc.secure_channel(target, credentials, options=opts)
            if credentials is not None
            else grpc.insecure_channel(target, options=opts)
        )
        self._stub = admin_pb2_grpc.AdminServiceStub(self._channel)
        self._metadata = auth_metadata(token)
        self.namespace = namespace
        self.timeout = timeout

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def create_token(
        self,
        namespace: str,
        roles: Iterable[str],
        *,
        ttl: timedelta | None = None,
        description: str = "",
    ) -> tuple[str, TokenInfo]:
        """A new token bound to `namespace` ("*": every one); returns (secret, info)."""
        req = admin_pb2.CreateTokenRequest(
            namespace=namespace,
            roles=[ROLES[r] for r in roles],
            description=description,
        )
        if ttl is not None:
            req.ttl.CopyFrom(_convert.to_duration(ttl))
        try:
            resp = self._stub.CreateToken(req, timeout=self.timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return resp.token, TokenInfo.from_proto(resp.info)

    def list_tokens(self, namespace: str = "") -> list[TokenInfo]:
        try:
            resp = self._stub.ListTokens(
                admin_pb2.ListTokensRequest(namespace=namespace),
                timeout=self.timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
        return [TokenInfo.from_proto(t) for t in resp.tokens]

    def revoke_token(self, token_id: str) -> None:
        try:
            self._stub.RevokeToken(
                admin_pb2.RevokeTokenRequest(token_id=token_id),
                timeout=self.timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None
