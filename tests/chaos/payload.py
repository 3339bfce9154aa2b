"""Job payloads with known content: the job's key, filler, and a checksum of both."""

from __future__ import annotations

import hashlib
import json


def make(key: str, size: int = 64) -> bytes:
    """A payload naming ``key``, padded to about ``size`` bytes, with a sha256."""
    pad = (key * (size // max(1, len(key)) + 1))[:size]
    body = {"key": key, "pad": pad}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return json.dumps({**body, "sha": digest}).encode()


def verify(data: bytes) -> tuple[str, bool]:
    """(key, intact): the key it names ("" when unreadable) and whether it is intact."""
    try:
        raw = json.loads(data)
        body = {"key": raw["key"], "pad": raw["pad"]}
    except (ValueError, KeyError, TypeError):
        return "", False
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return str(raw["key"]), digest == raw.get("sha")
