"""Which role each RPC needs and where its namespace comes from (README "Auth")."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from delayq_server.auth.principal import ADMIN, CONSUME, PRODUCE, READ


class Scope(enum.Enum):
    """Where an RPC's namespace is found, so the interceptor can check it."""

    NAMESPACE = "namespace"  # request.namespace ("" = "default")
    BATCH = "batch"  # request.requests[i].namespace
    LEASE = "lease"  # the namespace inside lease_token / lease_tokens
    PER_TOKEN = "per_token"  # like LEASE, answered per token (UNKNOWN for other namespaces)
    SERVICER = "servicer"  # the servicer scopes by itself (AdminService)
    ALL = "all"  # only principals of every namespace ("*")


@dataclass(frozen=True, slots=True)
class Rule:
    role: str
    scope: Scope


_QUEUE = "/delayq.v1.DelayQueueService/"
_ADMIN = "/delayq.v1.AdminService/"

RULES: dict[str, Rule] = {
    _QUEUE + "Enqueue": Rule(PRODUCE, Scope.NAMESPACE),
    _QUEUE + "EnqueueBatch": Rule(PRODUCE, Scope.BATCH),
    # Role at open; each message's namespaces in the servicer (rpc/enqueue_stream.py).
    _QUEUE + "EnqueueStream": Rule(PRODUCE, Scope.SERVICER),
    _QUEUE + "Consume": Rule(CONSUME, Scope.NAMESPACE),
    _QUEUE + "Ack": Rule(CONSUME, Scope.PER_TOKEN),
    _QUEUE + "Nack": Rule(CONSUME, Scope.LEASE),
    _QUEUE + "ExtendLease": Rule(CONSUME, Scope.LEASE),
    _QUEUE + "Release": Rule(CONSUME, Scope.PER_TOKEN),
    _QUEUE + "Query": Rule(READ, Scope.NAMESPACE),
    _QUEUE + "GetQueueStats": Rule(READ, Scope.NAMESPACE),
    _QUEUE + "ListDeadJobs": Rule(READ, Scope.NAMESPACE),
    _QUEUE + "Delete": Rule(ADMIN, Scope.NAMESPACE),
    _QUEUE + "RedriveDeadJobs": Rule(ADMIN, Scope.NAMESPACE),
    _QUEUE + "PurgeDeadJobs": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "CreateToken": Rule(ADMIN, Scope.SERVICER),
    _ADMIN + "ListTokens": Rule(ADMIN, Scope.SERVICER),
    _ADMIN + "RevokeToken": Rule(ADMIN, Scope.SERVICER),
    # Queue administration (issue 14): reads need the read role, changes admin.
    _ADMIN + "ListQueues": Rule(READ, Scope.SERVICER),  # filtered by the caller's namespace
    _ADMIN + "GetQueue": Rule(READ, Scope.NAMESPACE),
    _ADMIN + "ListJobs": Rule(READ, Scope.NAMESPACE),
    _ADMIN + "CreateQueue": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "UpdateQueue": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "DeleteQueue": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "PauseQueue": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "ResumeQueue": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "PurgeQueue": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "RescheduleJob": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "UpdateJob": Rule(ADMIN, Scope.NAMESPACE),
    _ADMIN + "RedriveDeadLetters": Rule(ADMIN, Scope.NAMESPACE),
}

# Health checks and reflection answer without credentials (load balancers,
# grpcurl); reflection can be switched off with --no-reflection.
OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)

# Deny by default: an RPC added without a rule needs an admin of every namespace.
DEFAULT_RULE = Rule(ADMIN, Scope.ALL)


def rule_for(method: str) -> Rule | None:
    """The rule of a method; None for the open ones."""
    if method.startswith(OPEN_PREFIXES):
        return None
    return RULES.get(method, DEFAULT_RULE)
