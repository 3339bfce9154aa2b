"""A digest of everything a request could have written to Redis.

Liveness keys are left out: replicas renew their heartbeat and timer ownership
leases every second (server/delayq_server/timers/ownership.py), and every open
Consume stream its quota slot every 10 s (the namespace's `:streams` set,
server/delayq_server/quotas.py), which is not a request writing anything.
"""

from __future__ import annotations

import hashlib

import redis

LIVENESS_KEYS = (b"dq:replicas",)
LIVENESS_SUFFIXES = (b":owner", b":streams")


def data_keys(client: redis.Redis) -> list[bytes]:
    keys: list[bytes] = client.keys("*")  # type: ignore[assignment]
    return sorted(k for k in keys if k not in LIVENESS_KEYS and not k.endswith(LIVENESS_SUFFIXES))


def redis_digest(client: redis.Redis) -> str:
    """SHA-256 over every data key's name and DUMP."""
    h = hashlib.sha256()
    for key in data_keys(client):
        h.update(key)
        dumped: bytes | None = client.dump(key)
        h.update(dumped or b"")
    return h.hexdigest()
