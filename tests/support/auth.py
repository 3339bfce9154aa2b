"""An auth-enabled server on a private redis-server, and stubs that carry a bearer token."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from delayq.v1 import admin_pb2, admin_pb2_grpc, service_pb2_grpc
from tests.support.servers import DelayqProcess, ManagedRedis

ROLE = {
    "produce": admin_pb2.TOKEN_ROLE_PRODUCE,
    "consume": admin_pb2.TOKEN_ROLE_CONSUME,
    "read": admin_pb2.TOKEN_ROLE_READ,
    "admin": admin_pb2.TOKEN_ROLE_ADMIN,
}


class _Bearer(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    def __init__(self, token: str) -> None:
        self._md = ("authorization", f"Bearer {token}")

    def _details(self, details: Any) -> Any:
        md = [*(details.metadata or []), self._md]
        return details._replace(metadata=md)

    def intercept_unary_unary(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(
        self, continuation: Callable[..., Any], details: Any, request: Any
    ) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_stream(
        self, continuation: Callable[..., Any], details: Any, requests: Any
    ) -> Any:
        return continuation(self._details(details), requests)


class AuthServer:
    """`delayq_server --auth` with its own Redis (the shared one is flushed per test)."""

    def __init__(self, data: Path, args: list[str] | None = None) -> None:
        self.redis = ManagedRedis(data / "redis", appendonly=False)
        self.token_file = data / "admin-token"
        self.args = args or []
        self.proc: DelayqProcess | None = None
        self._channels: list[grpc.Channel] = []

    def start(self) -> AuthServer:
        self.redis.start()
        self.proc = DelayqProcess(
            self.redis.url,
            ["--auth", "--auth-bootstrap-token-file", str(self.token_file), *self.args],
        ).start()
        self.admin_token = self.token_file.read_text().strip()
        return self

    def stop(self) -> None:
        for ch in self._channels:
            ch.close()
        if self.proc is not None:
            with contextlib.suppress(Exception):
                self.proc.terminate(15)
        self.redis.stop()

    @property
    def address(self) -> str:
        assert self.proc is not None
        return self.proc.address

    def channel(self, token: str | None) -> grpc.Channel:
        ch = grpc.insecure_channel(self.address)
        self._channels.append(ch)
        return grpc.intercept_channel(ch, _Bearer(token)) if token else ch

    def stub(self, token: str | None) -> service_pb2_grpc.DelayQueueServiceStub:
        return service_pb2_grpc.DelayQueueServiceStub(self.channel(token))

    def admin(self, token: str | None = None) -> admin_pb2_grpc.AdminServiceStub:
        return admin_pb2_grpc.AdminServiceStub(self.channel(token or self.admin_token))

    def token(self, namespace: str, *roles: str, **kw: Any) -> str:
        resp = self.admin().CreateToken(
            admin_pb2.CreateTokenRequest(namespace=namespace, roles=[ROLE[r] for r in roles], **kw),
            timeout=10,
        )
        return resp.token


@contextlib.contextmanager
def auth_server(data: Path, args: list[str] | None = None) -> Iterator[AuthServer]:
    srv = AuthServer(data, args)
    try:
        yield srv.start()
    finally:
        srv.stop()
