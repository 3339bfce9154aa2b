"""A small language for putting a shard into a known state (after asynq's testutil)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from delayq_server.ids import new_job_id
from delayq_server.redis_client import RedisClient
from delayq_server.store import JobSpec, LeaseRef, ShardKeys, Store

T0 = 1_800_000_000_000  # a fixed "now" for scripts, in ms
KEYS = ShardKeys("default", "q", 0)


def spec(
    *,
    delay_ms: int | None = 0,
    due_at_ms: int | None = None,
    ttl_ms: int = 0,
    max_attempts: int = 3,
    backoff_ms: int = 1000,
    backoff_max_ms: int = 60_000,
    multiplier: float = 2.0,
    jitter: float = 0.0,
    idempotency_key: str = "",
    payload: bytes = b"x",
    headers: dict[str, str] | None = None,
) -> JobSpec:
    return JobSpec(
        job_id=new_job_id(0, 1),
        payload=payload,
        headers=headers or {},
        delay_ms=None if due_at_ms is not None else delay_ms,
        due_at_ms=due_at_ms,
        ttl_ms=ttl_ms,
        max_attempts=max_attempts,
        backoff_initial_ms=backoff_ms,
        backoff_max_ms=backoff_max_ms,
        multiplier=multiplier,
        jitter=jitter,
        idempotency_key=idempotency_key,
    )


@dataclass
class Shard:
    """Seeds and inspects one shard through the real scripts."""

    store: Store
    keys: ShardKeys = KEYS
    now: int = T0
    _stream: int = field(default=0)

    async def scheduled(self, delay_ms: int, **kw: Any) -> str:
        (r,), _ = await self.store.enqueue(self.keys, [spec(delay_ms=delay_ms, **kw)], self.now)
        return r.job_id

    async def ready(self, **kw: Any) -> str:
        return await self.scheduled(0, **kw)

    async def leased(self, lease_ms: int = 30_000, **kw: Any) -> LeaseRef:
        job_id = await self.ready(**kw)
        # Put it at the consuming end so it is the one claimed, whatever else is ready.
        await self.store.redis.lrem(self.keys.ready, 1, job_id)
        await self.store.redis.rpush(self.keys.ready, job_id)
        (c,) = await self.claim(1, lease_ms)
        assert c.job_id == job_id
        return LeaseRef(c.job_id, c.nonce)

    async def claim(self, count: int = 10, lease_ms: int = 30_000) -> list[LeaseRef]:
        self._stream += 1
        claimed = await self.store.claim(
            self.keys, count, lease_ms, f"t.{self._stream}.0.", self.now
        )
        return [LeaseRef(c.job_id, c.nonce) for c in claimed]

    async def dead(self, **kw: Any) -> str:
        lease = await self.leased(**kw)
        await self.store.nack(
            self.keys, lease, delay_ms=None, dead_letter=True, reason="seeded", now_ms=self.now
        )
        return lease.job_id

    async def state(self, job_id: str) -> int:
        rec, _ = await self.store.get(self.keys, job_id)
        return int(rec.state_at(self.now))

    async def snapshot(self) -> dict[str, Any]:
        """Every structure of the shard, for before/after comparisons."""
        r: RedisClient = self.store.redis
        k = self.keys
        bucket_keys = sorted(_text(x) for x in await r.keys(k.prefix + "bt:*"))
        records: list[str] = []
        for group in await r.keys(k.prefix + "r:*"):
            records += [_text(x) for x in await r.hkeys(group)]
        return {
            "ready": await r.lrange(k.ready, 0, -1),
            "leased": await r.zrange(k.leased, 0, -1, withscores=True),
            "dead": await r.zrange(k.dead, 0, -1),
            "index": await r.zrange(k.index, 0, -1, withscores=True),
            "buckets": {b: await r.zrange(b, 0, -1, withscores=True) for b in bucket_keys},
            "records": sorted(records),  # job ids with a record
        }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class CallsAtOnce:
    """Wraps a store's script runner to count how many calls of one script are in
    flight at once (``peak``): whether bounded chunks go out together."""

    def __init__(self, store: Store, name: str) -> None:
        self.peak = 0
        self._active = 0
        self._name = name
        self._run = store._run
        store._run = self._counting  # type: ignore[method-assign]

    async def _counting(self, name: str, keys: Any, args: Any, request_key: str = "") -> Any:
        if name != self._name:
            return await self._run(name, keys, args, request_key)
        self._active += 1
        self.peak = max(self.peak, self._active)
        try:
            return await self._run(name, keys, args, request_key)
        finally:
            self._active -= 1
