"""Channel options and call helpers shared by Client, AsyncClient and Worker."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ADDR_ENV",
    "DEFAULT_TARGET",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ITEMS",
    "TOKEN_ENV",
    "auth_metadata",
    "channel_options",
    "resolve_target",
]

#: Environment variable read when no `token=` is given.
TOKEN_ENV = "DELAYQ_TOKEN"


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the API token (`token`, else $DELAYQ_TOKEN; none: empty).

    Sent as metadata on every call rather than as call credentials, which gRPC
    only allows on TLS channels: local development runs plaintext.
    """
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    return (("authorization", f"Bearer {token}"),) if token else ()


DEFAULT_TARGET = "127.0.0.1:50051"
#: Environment variable read when no `target` is given: the one address setting
#: of every client, the CLI and the examples (README "Two commands").
ADDR_ENV = "DELAYQ_ADDR"
_OLD_ADDR_ENV = "DELAYQ_TARGET"  # deprecated alias, read after DELAYQ_ADDR


def resolve_target(target: str | None) -> str:
    """`target`, else $DELAYQ_ADDR (or the deprecated $DELAYQ_TARGET), else 127.0.0.1:50051."""
    if target:
        return target
    return os.environ.get(ADDR_ENV) or os.environ.get(_OLD_ADDR_ENV) or DEFAULT_TARGET


#: EnqueueBatch takes at most 1000 jobs (contract) ...
MAX_BATCH_ITEMS = 1000
#: ... and stays under the 4 MiB default receive limit of gRPC servers.
MAX_BATCH_BYTES = 3 * 1024 * 1024

# Keepalive pings detect a dead server on an idle Consume stream. gRPC servers
# answer pings sent more often than every 5 minutes without data with GOAWAY
# (too_many_pings) unless they opt in; the delayq server permits pings every
# 10 s, so 30 s keeps well clear of that limit.
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000


def channel_options(extra: Sequence[tuple[str, Any]] = ()) -> list[tuple[str, Any]]:
    """Default options for a delayq channel; `extra` entries override them."""
    opts: dict[str, Any] = {
        "grpc.keepalive_time_ms": KEEPALIVE_TIME_MS,
        "grpc.keepalive_timeout_ms": KEEPALIVE_TIMEOUT_MS,
        "grpc.keepalive_permit_without_calls": 0,
        "grpc.http2.max_pings_without_data": 0,
        # A Consume message may carry up to 1000 deliveries of up to 256 KiB each.
        "grpc.max_receive_message_length": -1,
        # Reconnect promptly after a server restart; the worker adds its own jitter.
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": 2_000,
        # We retry ourselves, only where a repeat is safe.
        "grpc.enable_retries": 0,
    }
    opts.update(dict(extra))
    return list(opts.items())
