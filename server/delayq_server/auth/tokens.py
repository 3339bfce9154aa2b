"""Bearer tokens: format, hashing, and lookup with a sub-second cache.

A token is ``dq_<id>_<secret>``: a 64-bit public id (what ListTokens shows and
RevokeToken takes) and a 256-bit random secret. Redis keeps only the SHA-256
of the whole token. A fast unsalted hash is enough here because the secret is
256 random bits, not a password: there is no dictionary to try and no brute
force that can finish, so a slow KDF (bcrypt, argon2) would only add
milliseconds to every RPC. Hashes are compared in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import time
from dataclasses import dataclass

from delayq_server import clock
from delayq_server.auth.principal import Principal
from delayq_server.store.tokens import TokenRecord, TokenStore

_TOKEN = re.compile(r"^dq_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
TOKEN_ID = re.compile(r"^[0-9a-f]{16}$")

# Revocation reaches every replica within this (issue 9 asks for 1 s): a
# cached answer, positive or negative, is used for at most this long.
CACHE_TTL_S = 0.5
# Unknown tokens are cached too (so a flood of junk costs no Redis reads);
# the cache is cleared when it grows past this, so junk cannot grow memory.
CACHE_MAX = 10_000


def generate() -> tuple[str, str]:
    """A fresh token and its id: 64-bit id, 256-bit secret, both from os.urandom."""
    token_id = os.urandom(8).hex()
    secret = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    return f"dq_{token_id}_{secret}", token_id


def token_id_of(token: str) -> str | None:
    """The public id of a well-formed token, else None."""
    m = _TOKEN.match(token)
    return m.group(1) if m else None


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(slots=True)
class _Cached:
    principal: Principal | None
    expires_ms: int  # the token's own expiry; 0 = never
    until: float  # monotonic time the entry may be used to


class TokenAuthenticator:
    """Bearer token -> Principal, reading Redis at most once per token per CACHE_TTL_S."""

    def __init__(self, store: TokenStore, ttl_s: float = CACHE_TTL_S) -> None:
        self._store = store
        self._ttl = ttl_s
        self._cache: dict[str, _Cached] = {}

    def forget(self, token_id: str) -> None:
        """Drops a revoked token from this replica's cache at once."""
        for key in [
            k for k, v in self._cache.items() if v.principal and v.principal.name == token_id
        ]:
            del self._cache[key]

    async def authenticate(self, token: str) -> Principal | None:
        """The token's principal, or None for a malformed, unknown, expired or revoked token."""
        key = digest(token)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is None or hit.until < now:
            hit = await self._load(token, key, now)
        if hit.principal is None:
            return None
        if hit.expires_ms and hit.expires_ms <= clock.wall_ns() / 1_000_000:
            return None
        return hit.principal

    async def _load(self, token: str, key: str, now: float) -> _Cached:
        token_id = token_id_of(token)
        rec: TokenRecord | None = None
        if token_id is not None:
            rec = await self._store.get(token_id)
        principal = None
        if rec is not None and hmac.compare_digest(rec.secret_hash, key):
            principal = Principal(rec.namespace, frozenset(rec.roles), rec.token_id)
        entry = _Cached(principal, rec.expires_ms if rec else 0, now + self._ttl)
        if len(self._cache) >= CACHE_MAX:
            self._cache.clear()
        self._cache[key] = entry
        return entry
