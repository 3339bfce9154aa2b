"""A queue's push target in AdminService: proto to the config file's JSON and back (issue 15)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from delayq.v1 import admin_pb2
from delayq_server.errors import InvalidArgument
from delayq_server.push import config as push_config

WHERE = "settings.push"
MIN_SECRET_BYTES = 16  # as push/config.py's rule


def push_in(namespace: str, queue: str, m: admin_pb2.PushTarget, current: str | None) -> str:
    """Checks a requested target with the config file's rules (push/config.py) and
    returns the JSON stored in the queue's settings. An empty secret keeps the
    current target's: the secret is write-only, so a change of a header must not
    need it again."""
    raw: dict[str, Any] = {"url": m.url, "allow_http": m.allow_http}
    if m.method:
        raw["method"] = m.method
    if m.headers:
        raw["headers"] = dict(m.headers)
    if m.HasField("timeout"):
        if m.timeout.seconds < 0 or m.timeout.nanos < 0:
            raise InvalidArgument(WHERE + ".timeout", "must not be negative")
        raw["timeout"] = f"{m.timeout.seconds * 1000 + m.timeout.nanos // 1_000_000}ms"
    if m.concurrency:
        raw["concurrency"] = m.concurrency
    if m.success:
        raw["success"] = m.success
    if m.allowlist:
        raw["allowlist"] = list(m.allowlist)
    if m.max_response_bytes:
        raw["max_response_bytes"] = m.max_response_bytes
    secret = m.secret or (json.loads(current).get("secret", "") if current else "")
    if not secret:
        raise InvalidArgument(
            WHERE + ".secret",
            f"an HMAC key of at least {MIN_SECRET_BYTES} bytes is required (receivers verify "
            'signatures with it: README "Push delivery")',
        )
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise InvalidArgument(WHERE + ".secret", f"must be at least {MIN_SECRET_BYTES} bytes")
    raw["secret"] = secret
    try:
        push_config.queue_target(namespace, queue, raw, WHERE)
    except push_config.PushConfigError as exc:
        field, _, reason = str(exc).partition(": ")
        raise InvalidArgument(field, reason) from None
    return json.dumps(raw, sort_keys=True, separators=(",", ":"))


def push_out(stored: str) -> admin_pb2.PushTarget:
    """The stored target as GetQueue shows it: never the secret, only whether there is
    one and a fingerprint to tell two apart (a rotation took effect)."""
    raw = json.loads(stored)
    out = admin_pb2.PushTarget(
        url=raw.get("url", ""),
        method=raw.get("method", "POST"),
        headers=raw.get("headers", {}),
        concurrency=raw.get("concurrency", 8),
        success=raw.get("success", "2xx"),
        allow_http=raw.get("allow_http", False),
        allowlist=raw.get("allowlist", []),
        max_response_bytes=raw.get("max_response_bytes", 64 * 1024),
    )
    timeout_ms = int(raw.get("timeout", "10000ms").removesuffix("ms"))
    out.timeout.FromMilliseconds(timeout_ms)
    secret = raw.get("secret", "")
    if secret:
        out.has_secret = True
        out.secret_fingerprint = hashlib.sha256(secret.encode()).hexdigest()[:12]
    return out
