"""Operator transitions and listings of jobs (issue 14): purge, reschedule, update,
dead-letter retention, and pages of one state. Each call is bounded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from delayq_server.store import records
from delayq_server.store.keys import ShardKeys
from delayq_server.store.records import JobRecord, JobState
from delayq_server.store.store import Store, UnknownJob

# Jobs per purge / retention script call: 200 deletions take well under 1 ms
# of Redis time on a quiet machine and stay under the 5 ms bound of issue 14
# on a loaded one (500 reached 3-5 ms there; bench/admin.py measures it).
PURGE_LIMIT = 200


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NotWaiting(Exception):
    """The job is not in a state the operation accepts (its state is ``state``)."""

    def __init__(self, state: JobState) -> None:
        super().__init__(state.name)
        self.state = state


class LeasedJob(NotWaiting):
    """The job is leased and the caller did not force."""


class PastExpiry(Exception):
    """The new due time is at or after the job's TTL expiry."""


@dataclass(frozen=True, slots=True)
class Rescheduled:
    previous: JobState
    due_ms: int
    nonce: str  # of a lease taken back ('' otherwise)


@dataclass(frozen=True, slots=True)
class Page:
    """Ids of one state in order, with where the next page starts in this shard."""

    ids: list[str]
    bucket: int  # scheduled only: the bucket the next page starts in
    offset: int  # rank (or rank within the bucket) the next page starts at
    more: bool  # this shard may hold more in range


class JobAdmin:
    """Made beside a Store by its users (admin servicers, janitor); every method
    is one bounded script or a few bounded reads."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @property
    def _redis(self) -> Any:
        return self._store.redis

    def _all_keys(self, keys: ShardKeys) -> list[str]:
        return self._store._all_keys(keys)  # the same KEYS list as Store's scripts

    async def purge(
        self, keys: ShardKeys, state: JobState, limit: int = PURGE_LIMIT
    ) -> tuple[int, int]:
        """Deletes up to ``limit`` jobs of ``state``, oldest first; (purged, left)."""
        purged, left = await self._store._run(
            "purge", self._all_keys(keys), [keys.prefix, int(state), min(limit, PURGE_LIMIT)]
        )
        return int(purged), int(left)

    async def reschedule(
        self,
        keys: ShardKeys,
        job_id: str,
        *,
        delay_ms: int | None,
        due_ms: int | None,
        force: bool,
        now_ms: int | None = None,
    ) -> Rescheduled:
        code, state, due, nonce = await self._store._run(
            "reschedule",
            [keys.index, keys.ready, keys.leased, keys.stats],
            [
                keys.prefix,
                "" if now_ms is None else str(now_ms),
                await self._store._width(keys),
                job_id,
                -1 if delay_ms is None else delay_ms,
                -1 if due_ms is None else due_ms,
                "1" if force else "0",
                keys.channel,
            ],
        )
        code = int(code)
        if code == -1:
            raise UnknownJob(job_id)
        if code == -3:
            raise LeasedJob(JobState(int(state)))
        if code == -4:
            raise NotWaiting(JobState(int(state)))
        if code == -5:
            raise PastExpiry(job_id)
        return Rescheduled(JobState(int(state)), int(due), _s(nonce))

    async def update(
        self,
        keys: ShardKeys,
        job_id: str,
        *,
        payload: bytes | None,
        headers: dict[str, str] | None,
    ) -> None:
        code, state = await self._store._run(
            "update_job",
            [keys.record_group(job_id)],
            [
                keys.prefix,
                "0" if payload is None else "1",
                payload or b"",
                "0" if headers is None else "1",
                records.pack_headers(headers or {}),
                job_id,
            ],
        )
        if int(code) == -1:
            raise UnknownJob(job_id)
        if int(code) == -4:
            raise NotWaiting(JobState(int(state)))

    async def retain(
        self, keys: ShardKeys, max_age_ms: int, max_jobs: int, now_ms: int | None = None
    ) -> tuple[int, bool, int | None]:
        """Deletes dead jobs over the queue's retention (age or count; per shard
        the count is max_jobs / shards, rounded up); (deleted, more to do, ms
        until the oldest dead job ages out or None)."""
        deleted, more, next_in = await self._store._run(
            "retain",
            [keys.dead, keys.expiring],
            [keys.prefix, "" if now_ms is None else str(now_ms), max_age_ms, max_jobs, PURGE_LIMIT],
        )
        return int(deleted), int(more) == 1, None if int(next_in) < 0 else int(next_in)

    # -- listings -----------------------------------------------------------------

    async def scheduled_page(
        self,
        keys: ShardKeys,
        lo_ms: int,
        hi_ms: int,
        bucket: int,
        offset: int,
        count: int,
    ) -> Page:
        """Backlog ids due in [lo_ms, hi_ms), by due time, from ``bucket`` on.

        ``bucket`` is a bucket start ms (layout v2: the index scores bucket
        starts, a bucket holds the due times up to the next start), so walking
        the index by score walks them in due order; at most 64 buckets per call.
        """
        holder = await self._redis.zrange(
            keys.index, lo_ms, "-inf", desc=True, byscore=True, offset=0, num=1
        )
        start = max(int(_s(holder[0])) if holder else lo_ms, bucket)
        heads = await self._redis.zrangebyscore(keys.index, start, hi_ms - 1, 0, 64)
        ids: list[str] = []
        for raw in heads:
            b = int(_s(raw))
            skip = offset if b == bucket else 0
            want = count - len(ids)
            got = [
                _s(x)
                for x in await self._redis.zrangebyscore(
                    keys.bucket(b), lo_ms, f"({hi_ms}", skip, want + 1
                )
            ]
            if len(got) > want:
                return Page(ids + got[:want], b, skip + want, True)
            ids += got
            if len(ids) == count:
                return Page(ids, b + 1, 0, True)
        more = len(heads) == 64
        last = int(_s(heads[-1])) + 1 if heads else start
        return Page(ids, last, 0, more)

    async def ready_page(self, keys: ShardKeys, offset: int, count: int) -> Page:
        """Ready ids oldest first (from the list's tail)."""
        raw = await self._redis.lrange(keys.ready, -(offset + count), -(offset + 1))
        ids = [_s(x) for x in reversed(raw)]
        return Page(ids, 0, offset + len(ids), len(ids) == count)

    async def zset_page(self, key: str, lo_ms: int, hi_ms: int, offset: int, count: int) -> Page:
        """Members of a time-scored set (leased, dead, done) in [lo_ms, hi_ms)."""
        raw = await self._redis.zrangebyscore(key, lo_ms, f"({hi_ms}", offset, count)
        ids = [_s(x) for x in raw]
        return Page(ids, 0, offset + len(ids), len(ids) == count)

    async def backlog_buckets(self, keys: ShardKeys, most: int = 500) -> list[tuple[int, int]]:
        """(earliest due ms, job count) of the first ``most`` backlog buckets:
        one index read and one pipelined ZCARD per bucket (the dashboard's
        due-time histogram; later buckets are counted by the caller as the rest)."""
        heads = await self._redis.zrange(keys.index, 0, most - 1)
        if not heads:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for b in heads:
                pipe.zrange(keys.bucket(_s(b)), 0, 0, withscores=True)
                pipe.zcard(keys.bucket(_s(b)))
            got = await pipe.execute()
        return [
            (int(first[0][1]), int(n))
            for first, n in zip(got[::2], got[1::2], strict=True)
            if first  # emptied since the index read
        ]

    async def records(self, keys: ShardKeys, ids: list[str]) -> list[tuple[str, JobRecord]]:
        """The records of ``ids`` that still exist, in order (one pipeline)."""
        return await self._store.records(keys, ids)
