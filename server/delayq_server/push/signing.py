"""Delayq-Signature: ``t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>``."""

from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "Delayq-Signature"


def sign(secret: bytes, body: bytes, now_s: int | None = None) -> str:
    """The header value for ``body``; the timestamp lets receivers refuse replays."""
    t = int(time.time()) if now_s is None else now_s
    mac = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"
