"""Who is calling: a namespace (or every one) and a set of roles."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass

PRODUCE = "produce"
CONSUME = "consume"
READ = "read"
ADMIN = "admin"
ROLES = (PRODUCE, CONSUME, READ, ADMIN)
ALL_NAMESPACES = "*"


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller of one RPC, as authenticated by the interceptor."""

    namespace: str  # ALL_NAMESPACES or one namespace
    roles: frozenset[str]
    name: str  # token id or certificate identity: for messages and logs, never a secret

    def allows(self, namespace: str) -> bool:
        return self.namespace == ALL_NAMESPACES or self.namespace == namespace

    def has(self, role: str) -> bool:
        return role in self.roles


# With auth off every call acts as this principal (`make run` for local work).
UNRESTRICTED = Principal(ALL_NAMESPACES, frozenset(ROLES), "auth-off")

_current: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "delayq_principal", default=UNRESTRICTED
)


def current() -> Principal:
    """The principal of the RPC running in this task (UNRESTRICTED with auth off)."""
    return _current.get()


def set_current(p: Principal) -> None:
    _current.set(p)


def namespace_refusal(p: Principal, namespaces: Iterable[str]) -> str | None:
    """The PERMISSION_DENIED text for the first namespace `p` does not cover, else None.
    Used by the interceptor (a request's namespaces) and per EnqueueStream message."""
    if p.namespace == ALL_NAMESPACES:
        return None
    for ns in namespaces:
        if not p.allows(ns):
            return f"namespace: {p.name} is bound to namespace {p.namespace!r}, not {ns[:80]!r}"
    return None
