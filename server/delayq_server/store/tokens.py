"""API token records in Redis: create, look up, list and revoke (issue 9)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from delayq_server.store.keys import AUTH_BOOTSTRAP_KEY, TOKENS_KEY, token_key

if TYPE_CHECKING:
    from delayq_server.redis_client import RedisClient

# Listing reads every record: the count is bounded so ListTokens stays one
# small pipelined read (docs/design.md, promise 7).
MAX_TOKENS = 10_000


class TooManyTokens(Exception):
    """The token store holds MAX_TOKENS already."""


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """What Redis keeps of a token: a hash of the secret, never the secret."""

    token_id: str
    secret_hash: str  # hex sha256 of the whole bearer token
    namespace: str  # "*" = every namespace
    roles: tuple[str, ...]
    description: str
    created_ms: int
    expires_ms: int  # 0 = never


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _decode(token_id: str, raw: Any) -> TokenRecord | None:
    if not raw:
        return None
    f = {_s(k): _s(v) for k, v in raw.items()}
    return TokenRecord(
        token_id=token_id,
        secret_hash=f.get("hash", ""),
        namespace=f.get("ns", ""),
        roles=tuple(r for r in f.get("roles", "").split(",") if r),
        description=f.get("desc", ""),
        created_ms=int(f.get("created", "0")),
        expires_ms=int(f.get("expires", "0")),
    )


class TokenStore:
    """Token records, keyed by their public id; the secret's hash is in the record."""

    def __init__(self, client: RedisClient) -> None:
        self.redis = client

    async def time_ms(self) -> int:
        sec, usec = await self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    async def create(self, rec: TokenRecord) -> None:
        """Stores a new token; Redis drops it by itself when it expires."""
        if await self.redis.zcard(TOKENS_KEY) >= MAX_TOKENS:
            raise TooManyTokens()
        key = token_key(rec.token_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                key,
                mapping={
                    "hash": rec.secret_hash,
                    "ns": rec.namespace,
                    "roles": ",".join(rec.roles),
                    "desc": rec.description,
                    "created": rec.created_ms,
                    "expires": rec.expires_ms,
                },
            )
            if rec.expires_ms:
                pipe.pexpireat(key, rec.expires_ms)
            pipe.zadd(TOKENS_KEY, {rec.token_id: rec.created_ms})
            await pipe.execute()

    async def get(self, token_id: str) -> TokenRecord | None:
        return _decode(token_id, await self.redis.hgetall(token_key(token_id)))

    async def list(self) -> list[TokenRecord]:
        """Every live token, oldest first; ids of expired ones are dropped from the index."""
        raw_ids: list[Any] = await self.redis.zrange(TOKENS_KEY, 0, MAX_TOKENS - 1)
        ids = [_s(x) for x in raw_ids]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for token_id in ids:
                pipe.hgetall(token_key(token_id))
            raws = await pipe.execute()
        out, gone = [], []
        for token_id, raw in zip(ids, raws, strict=True):
            rec = _decode(token_id, raw)
            if rec is None:
                gone.append(token_id)
            else:
                out.append(rec)
        if gone:
            await self.redis.zrem(TOKENS_KEY, *gone)
        return out

    async def revoke(self, token_id: str) -> bool:
        """Deletes a token; False when there was none."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(token_key(token_id))
            pipe.zrem(TOKENS_KEY, token_id)
            deleted, _ = await pipe.execute()
        return int(deleted) > 0

    async def claim_bootstrap(self) -> bool:
        """True for exactly one caller ever (per Redis): the replica that makes the
        first admin token, so replicas starting together do not each print one."""
        return bool(await self.redis.set(AUTH_BOOTSTRAP_KEY, "1", nx=True))
