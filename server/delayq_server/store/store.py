"""Typed store API, one method per state transition; each is one Lua script.

Times are Redis-clock milliseconds. ``now_ms=None`` lets the script read Redis
``TIME`` (production); tests pass an explicit clock to cross due boundaries
deterministically.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgpack
from redis.commands.core import AsyncScript

from delayq_server import redis_client
from delayq_server.redis_client import run_script
from delayq_server.store import records, scripts
from delayq_server.store.backlog import BacklogDue, backlog_due
from delayq_server.store.chunks import (
    ENQUEUE_BUDGET_US,
    enqueue_chunks,
    fixed_chunks,
    in_chunks,
)
from delayq_server.store.keys import (
    QUEUES_KEY,
    REPLICAS_KEY,
    ShardKeys,
    queue_meta_key,
    server_channel,
)
from delayq_server.store.layout import LAYOUT
from delayq_server.store.queues import Queues
from delayq_server.store.records import JobRecord, JobState

if TYPE_CHECKING:
    from delayq_server.redis_client import RedisClient

# Bounds on one script call (docs/design.md: every script is bounded).
MAX_BATCH = 1000
PROMOTE_LIMIT = 500
REAP_LIMIT = 200
# A claim costs about 10-15 µs of Redis time per job (record read and rewrite,
# lease index): 500 per call held Redis 5-20 ms in a burst (bench-scale), 100
# stayed near 1.5 ms but reached 6.3 ms twice in the 1M burst beside a 10M
# backlog; 50 keeps the slowest under 5 ms. A stream with more credit claims
# again in its next round.
CLAIM_LIMIT = 50
# The same bound for scripts that take a caller's list of leases: an Ack or a
# Release of 1,000 deliveries is several calls. 200 acks per call reached 5.4 ms of
# Redis time in the 1M burst of bench-scale (10M backlog in place); 100 halves it.
ACK_CHUNK = 100
RELEASE_CHUNK = 100
EXPIRE_LIMIT = 200
# Jobs per enqueue script call: store/chunks.py.
SCRIPTS_IN_FLIGHT = 48  # below the 64 connections per Redis node (redis_client.py)
# A script the client re-sends (redis_client.py: retries on a dropped connection) must
# still find its first run's reply (lua/includes/replay.lua).
assert (
    redis_client.RETRIES * (redis_client.BACKOFF_CAP_S + redis_client.CONNECT_TIMEOUT_S) * 1000
    < scripts.REPLAY_TTL_MS / 2
)


T = TypeVar("T")


def _order_free(jobs: Sequence[JobSpec]) -> bool:
    """Whether a batch's chunks may run in any order: no idempotency key (the first
    of two equal keys must win) and no job due at once (ready jobs keep their batch
    order). Delayed jobs are ordered by due time and id whatever the order of calls."""
    # A due_at_ms job (delay_ms None) may be due already by Redis' clock.
    return not any(j.idempotency_key or j.delay_ms is None or j.delay_ms <= 0 for j in jobs)


def shard_channel(keys: ShardKeys) -> str:
    """Where a shard's scripts SPUBLISH its wake-ups (a seam: tests lose events here)."""
    return keys.channel


class UnknownJob(Exception):
    """No job with that id (never existed, acked, deleted, expired or purged)."""


class StaleLease(Exception):
    """The lease token is no longer current: the job was redelivered, released or retried."""


@dataclass(slots=True)
class JobSpec:
    """One validated job to store. Not frozen: the servicer fills in ``job_id``
    (and trace headers) in place instead of copying it per job (issue 12 profile)."""

    job_id: str
    payload: bytes
    headers: dict[str, str]
    delay_ms: int | None  # exactly one of delay_ms / due_at_ms is set
    due_at_ms: int | None
    ttl_ms: int
    max_attempts: int
    backoff_initial_ms: int
    backoff_max_ms: int
    multiplier: float
    jitter: float
    idempotency_key: str


@dataclass(slots=True)  # not frozen: one per enqueued job, and a frozen __init__ costs 3x
class EnqueueResult:
    job_id: str
    due_ms: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class Claimed:
    job_id: str
    nonce: str
    record: JobRecord
    lease_deadline_ms: int


@dataclass(frozen=True, slots=True)
class LeaseRef:
    """A lease as the fence sees it: job id plus the nonce stored at claim."""

    job_id: str
    nonce: str


class AckOutcome:
    ACKED = 1
    STALE = 2
    UNKNOWN = 3


class ReleaseOutcome:
    """release.lua's per-lease codes."""

    RELEASED = 1
    STALE = 2
    UNKNOWN = 3
    DEAD = 4  # a counted release on the final attempt


@dataclass(frozen=True, slots=True)
class NackOutcome:
    state: JobState
    due_ms: int


@dataclass(frozen=True, slots=True)
class PromoteResult:
    moved: int
    next_due_ms: int | None
    now_ms: int


@dataclass(frozen=True, slots=True)
class ReapResult:
    reaped: list[LeaseRef]
    next_deadline_ms: int | None
    now_ms: int
    more: bool
    dead: frozenset[str] = frozenset()  # job ids dead-lettered (their final attempt)


@dataclass(frozen=True, slots=True)
class ExpireResult:
    expired: int
    trimmed: int
    next_ms: int | None  # when the shard next needs a sweep; None: nothing pending
    now_ms: int


@dataclass(frozen=True, slots=True)
class ShardStats:
    scheduled: int
    ready: int
    leased: int
    dead: int
    completed: int
    oldest_ready_due_ms: int | None
    next_due_ms: int | None
    counters: dict[str, int]
    now_ms: int


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _ignore_head(keys: ShardKeys, next_due_ms: int | None, now_ms: int) -> None:
    pass


def _now_arg(now_ms: int | None) -> str:
    return "" if now_ms is None else str(now_ms)


class Store:
    """The only object that talks to Redis."""

    def __init__(
        self,
        client: RedisClient,
        *,
        bucket_width_ms: int = 1000,
        idempotency_window_ms: int = 24 * 3600 * 1000,
        completed_retention_ms: int = 0,
        default_shards: int = 1,
        events_maxlen: int = 0,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.redis = client
        # Called after every script call with its name and perf_counter start
        # (telemetry.py: the script latency histogram); None costs nothing.
        self.observe = observe
        # > 0: every transition is also XADDed to the shard's events stream,
        # trimmed to about this many entries (--record-events, store/lifecycle.py).
        self.events_maxlen = events_maxlen
        self.bucket_width_ms = bucket_width_ms
        self.idempotency_window_ms = idempotency_window_ms
        self.completed_retention_ms = completed_retention_ms
        self.default_shards = default_shards
        self._scripts: dict[str, AsyncScript] = {
            name: client.register_script(scripts.source(name)) for name in scripts.NAMES
        }
        self._shards: dict[tuple[str, str], int] = {}
        self._widths: dict[tuple[str, str], int] = {}
        self.enqueue_budget_us = ENQUEUE_BUDGET_US  # enqueue.lua's Redis time per call
        # Request ids: unique per call across replicas and restarts.
        self._rq_prefix = os.urandom(6).hex() + "."
        self._rq_seq = itertools.count(1)
        # Scripts in flight at once. The single-node pool blocks when all its
        # connections are busy, but redis-py's cluster client fails instead
        # ("Too many connections"); a batch over hundreds of shards must queue.
        self._in_flight = asyncio.Semaphore(SCRIPTS_IN_FLIGHT)
        # Told the backlog's next due ms (None: empty) and Redis' now after every
        # claim: this replica's promoter sleeps on it (timers/promoter.py).
        self.on_backlog_head: Callable[[ShardKeys, int | None, int], None] = _ignore_head
        self.queues = Queues(self)

    def forget_queue(self, namespace: str, queue: str) -> None:
        """Drops what this replica cached of a deleted queue (shards, width, settings)."""
        self._shards.pop((namespace, queue), None)
        self._widths.pop((namespace, queue), None)
        self.queues.forget(namespace, queue)

    async def completed_retention(self, keys: ShardKeys) -> int:
        """The queue's completed-retention window, else the server's (issue 14)."""
        settings = self.queues.cached(keys.namespace, keys.queue)
        if settings is None:
            settings = await self.queues.settings(keys.namespace, keys.queue)
        if settings is None or settings.completed_retention_ms is None:
            return self.completed_retention_ms
        return settings.completed_retention_ms

    def script_shas(self) -> dict[str, str]:
        """sha1 -> script name, to read SLOWLOG entries (EVALSHA <sha>)."""
        return {s.sha: name for name, s in self._scripts.items()}

    async def load_scripts(self) -> None:
        """Loads every script now, so the first call of each needs no retry."""
        for script in self._scripts.values():
            script.sha = await self.redis.script_load(script.script)

    async def _run(
        self, name: str, keys: Sequence[str], args: Sequence[Any], request_key: str = ""
    ) -> Any:
        """Runs one script, with a fresh request key (or ``request_key``, which a
        batch's enqueue calls share) appended to its KEYS.

        The client re-sends a command when its connection drops (redis_client.py),
        so each call of a state-changing script carries a request id: a re-sent
        call returns the first run's reply (lua/includes/replay.lua). Every
        replayed script's ARGV[1] is its shard's key prefix, where the request
        key lives. Scripts that record lifecycle events get the events MAXLEN
        as their last argument (lua/includes/events.lua).
        """
        argv = list(args)
        if name in scripts.RECORDS_EVENTS:
            argv.append(self.events_maxlen)
        if name in scripts.REPLAYED:
            prefix = args[0]
            assert isinstance(prefix, str) and prefix.startswith("dq:{"), prefix
            keys = [*keys, request_key or self._request_key(prefix)]
        script = self._scripts[name]
        async with self._in_flight:
            if self.observe is None:
                return await run_script(self.redis, script, keys, argv)
            # Timed inside the gate: the script's round trip, not the wait for a slot.
            started = time.perf_counter()
            try:
                return await run_script(self.redis, script, keys, argv)
            finally:
                self.observe(name, started)

    def _request_key(self, prefix: str) -> str:
        """A key no other call uses, in the shard's hash tag (lua/includes/replay.lua)."""
        return f"{prefix}rq:{self._rq_prefix}{next(self._rq_seq)}"

    # -- queues -----------------------------------------------------------------

    def known(self, namespace: str, queue: str) -> bool:
        """Whether this replica has used the queue already (its shard count is cached)."""
        return (namespace, queue) in self._shards

    async def shard_count(self, namespace: str, queue: str, *, create: bool) -> int:
        """Shard count of a queue, fixed when the queue is first used.

        Returns 0 for a queue that does not exist when ``create`` is false.
        The bucket width is fixed at creation too, stored beside the shard
        count: buckets are named by due // width, so a queue must keep the
        width its backlog was written with, whatever the flag says later.
        """
        cached = self._shards.get((namespace, queue))
        if cached:
            return cached
        meta = queue_meta_key(namespace, queue)
        if create:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.hsetnx(meta, "shards", self.default_shards)
                pipe.hsetnx(meta, "bucket_width", self.bucket_width_ms)
                pipe.hsetnx(meta, "layout", LAYOUT)
                pipe.hmget(meta, ["shards", "bucket_width"])
                pipe.sadd(QUEUES_KEY, f"{namespace}/{queue}")
                _, _, _, (raw, width), _ = await pipe.execute()
        else:
            raw, width = await self.redis.hmget(meta, ["shards", "bucket_width"])
            if raw is None:
                return 0
            if width is None:
                # A queue created before widths were stored: pin the current one.
                await self.redis.hsetnx(meta, "bucket_width", self.bucket_width_ms)
                width = await self.redis.hget(meta, "bucket_width")
        count = int(raw)
        self._widths[(namespace, queue)] = int(width)
        self._shards[(namespace, queue)] = count
        return count

    async def _width(self, keys: ShardKeys) -> int:
        """The queue's own bucket width (see shard_count)."""
        width = self._widths.get((keys.namespace, keys.queue))
        if width is None:
            await self.shard_count(keys.namespace, keys.queue, create=False)
            width = self._widths.get((keys.namespace, keys.queue), self.bucket_width_ms)
        return width

    async def known_queues(self) -> list[tuple[str, str]]:
        """Every queue any replica has created, as (namespace, queue)."""
        members = await self.redis.smembers(QUEUES_KEY)
        out = []
        for m in sorted(_s(x) for x in members):
            ns, _, q = m.partition("/")
            out.append((ns, q))
        return out

    async def time_ms(self) -> int:
        sec, usec = await self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    async def notify_server(self, server_id: str, message: str) -> None:
        """Sends ``message`` to one replica's own shard channel (credit for its streams)."""
        await self.redis.spublish(server_channel(server_id), message)

    # -- transitions ------------------------------------------------------------

    async def enqueue(
        self, keys: ShardKeys, jobs: Sequence[JobSpec], now_ms: int | None = None
    ) -> tuple[list[EnqueueResult], int]:
        """Stores jobs of one shard; duplicates of an idempotency key store nothing.

        At most ENQUEUE_CHUNK jobs and ENQUEUE_DUE_TIMES due times per script call
        (store/chunks.py), so a 1,000-job batch never blocks Redis for long (DESIGN:
        bounded scripts); the calls go out together when their order cannot show
        (_order_free).
        """
        if not 0 < len(jobs) <= MAX_BATCH:
            raise ValueError(f"enqueue takes 1 to {MAX_BATCH} jobs per call")
        chunks = enqueue_chunks(jobs)
        request_key = self._request_key(keys.prefix)  # one replay entry per batch
        numbered = list(enumerate(chunks))
        parts = await in_chunks(
            numbered,
            lambda part: self._enqueue_chunk(keys, part[1], now_ms, request_key, part[0]),
            together=len(chunks) > 1 and _order_free(jobs),
        )
        return [r for chunk, _ in parts for r in chunk], parts[-1][1]

    async def _enqueue_chunk(
        self,
        keys: ShardKeys,
        jobs: Sequence[JobSpec],
        now_ms: int | None,
        request_key: str,
        chunk_no: int,
    ) -> tuple[list[EnqueueResult], int]:
        """One chunk, in as many calls as enqueue.lua's time budget needs (one
        mostly): a call that stopped short is followed by one for the rest."""
        results, now = await self._enqueue_call(keys, jobs, now_ms, request_key, f"{chunk_no}")
        while len(results) < len(jobs):
            done = len(results)
            more, now = await self._enqueue_call(
                keys, jobs[done:], now_ms, request_key, f"{chunk_no}.{done}"
            )
            results += more
        return results, now

    async def _enqueue_call(
        self,
        keys: ShardKeys,
        jobs: Sequence[JobSpec],
        now_ms: int | None,
        request_key: str,
        field: str,
    ) -> tuple[list[EnqueueResult], int]:
        packed = msgpack.packb(
            [
                [
                    j.job_id,
                    -1 if j.delay_ms is None else j.delay_ms,
                    -1 if j.due_at_ms is None else j.due_at_ms,
                    j.ttl_ms,
                    j.max_attempts,
                    j.backoff_initial_ms,
                    j.backoff_max_ms,
                    float(j.multiplier),
                    float(j.jitter),
                    records.pack_headers(j.headers),
                    j.payload,
                    j.idempotency_key,
                ]
                for j in jobs
            ],
            use_bin_type=False,  # Redis 7.0's cmsgpack predates the bin type: bytes go as raw
        )
        args: list[Any] = [
            keys.prefix,
            _now_arg(now_ms),
            field,
            self.idempotency_window_ms,
            shard_channel(keys),
            len(jobs),
            packed,
            self.enqueue_budget_us,
        ]
        out = await self._run(
            "enqueue", [keys.index, keys.ready, keys.stats, keys.expiring], args, request_key
        )
        now = int(out[0])
        # A stored job is answered with the id it was sent with: only a duplicate's
        # (the holder of its idempotency key) needs decoding.
        results = [
            EnqueueResult(_s(out[i]), int(out[i + 1]), True)
            if out[i + 2] == 1
            else EnqueueResult(j.job_id, int(out[i + 1]), False)
            # The call may have stored the first jobs only (its time budget).
            for i, j in zip(range(1, len(out), 3), jobs[: (len(out) - 1) // 3], strict=True)
        ]
        return results, now

    async def promote(
        self, keys: ShardKeys, limit: int = PROMOTE_LIMIT, now_ms: int | None = None
    ) -> PromoteResult:
        """Moves due ids to the ready list (at most ``limit``)."""
        moved, next_due, now = await self._run(
            "promote",
            [keys.index, keys.ready, keys.stats],
            [keys.prefix, _now_arg(now_ms), limit, await self._width(keys), shard_channel(keys)],
        )
        return PromoteResult(int(moved), None if next_due < 0 else int(next_due), int(now))

    async def claim(
        self,
        keys: ShardKeys,
        count: int,
        lease_ms: int,
        nonce_prefix: str,
        now_ms: int | None = None,
    ) -> list[Claimed]:
        """Leases up to ``count`` ready jobs, each with a fresh nonce ending in 64 random bits.

        Due jobs are promoted first when the ready list holds fewer than ``count``;
        the backlog's next due time goes to ``on_backlog_head`` (the promoter).
        """
        count = min(count, CLAIM_LIMIT)
        out = await self._run(
            "claim",
            [
                keys.ready,
                keys.leased,
                keys.stats,
                keys.expiring,
                keys.dead,
                keys.paused,
                keys.index,
            ],
            [
                keys.prefix,
                _now_arg(now_ms),
                count,
                lease_ms,
                nonce_prefix,
                shard_channel(keys),
                os.urandom(8 * count).hex(),
            ],
        )
        now, next_due = int(out[0]), int(out[1])
        if next_due != -2:  # -2: paused, the backlog was not read
            self.on_backlog_head(keys, None if next_due < 0 else next_due, now)
        claimed = []
        for i in range(2, len(out), 3):
            rec = records.decode(out[i + 2])
            claimed.append(Claimed(_s(out[i]), _s(out[i + 1]), rec, now + lease_ms))
        return claimed

    async def ack(
        self, keys: ShardKeys, leases: Sequence[LeaseRef], now_ms: int | None = None
    ) -> list[int]:
        """Completes leases whose nonce is current; one AckOutcome code per lease."""
        retention = await self.completed_retention(keys)

        async def one(chunk: Sequence[LeaseRef]) -> list[int]:
            args: list[Any] = [keys.prefix, _now_arg(now_ms), retention, len(chunk)]
            for lease in chunk:
                args += [lease.job_id, lease.nonce]
            out = await self._run("ack", [keys.leased, keys.stats, keys.expiring, keys.done], args)
            return [int(x) for x in out]

        # Distinct jobs: the outcomes do not depend on the order of the calls. A
        # job named twice keeps first-listed-wins order.
        distinct = len(leases) > ACK_CHUNK and len({x.job_id for x in leases}) == len(leases)
        parts = await in_chunks(fixed_chunks(leases, ACK_CHUNK), one, together=distinct)
        return [code for part in parts for code in part]

    async def nack(
        self,
        keys: ShardKeys,
        lease: LeaseRef,
        *,
        delay_ms: int | None,
        dead_letter: bool,
        reason: str,
        now_ms: int | None = None,
    ) -> NackOutcome:
        """Retries (after ``delay_ms`` or the job's backoff) or dead-letters a lease."""
        code, state, due = await self._run(
            "nack",
            [keys.index, keys.ready, keys.leased, keys.dead, keys.stats],
            [
                keys.prefix,
                _now_arg(now_ms),
                await self._width(keys),
                lease.job_id,
                lease.nonce,
                -1 if delay_ms is None else delay_ms,
                1 if dead_letter else 0,
                reason,
                shard_channel(keys),
            ],
        )
        self._check(int(code))
        return NackOutcome(JobState(int(state)), int(due))

    async def extend(
        self, keys: ShardKeys, lease: LeaseRef, extension_ms: int, now_ms: int | None = None
    ) -> int:
        """Pushes the lease deadline to now + extension; returns the new deadline."""
        code, deadline = await self._run(
            "extend",
            [keys.leased],
            [keys.prefix, _now_arg(now_ms), lease.job_id, lease.nonce, extension_ms],
        )
        self._check(int(code))
        return int(deadline)

    async def reap(
        self, keys: ShardKeys, limit: int = REAP_LIMIT, now_ms: int | None = None
    ) -> ReapResult:
        """Returns expired leases to the backlog (backoff) or the dead set."""
        out = await self._run(
            "reap",
            [keys.index, keys.ready, keys.leased, keys.dead, keys.stats],
            [keys.prefix, _now_arg(now_ms), limit, await self._width(keys), shard_channel(keys)],
        )
        count, next_deadline, now = int(out[0]), int(out[1]), int(out[2])
        reaped = [LeaseRef(_s(out[i]), _s(out[i + 1])) for i in range(3, len(out), 3)]
        dead = frozenset(_s(out[i]) for i in range(3, len(out), 3) if int(out[i + 2]) == 1)
        return ReapResult(
            reaped, None if next_deadline < 0 else next_deadline, now, count >= limit, dead
        )

    async def release(
        self,
        keys: ShardKeys,
        leases: Sequence[LeaseRef],
        now_ms: int | None = None,
        *,
        unsent: frozenset[str] = frozenset(),
    ) -> int:
        """Puts a closed stream's current leases back to ready; returns how many.

        Leases whose nonce is in ``unsent`` were claimed but never reached the
        stream: their attempt is not counted.
        """
        codes = await self._release(
            keys, [(lease, lease.nonce not in unsent) for lease in leases], now_ms
        )
        return sum(1 for c in codes if c == ReleaseOutcome.RELEASED)

    async def give_back(
        self, keys: ShardKeys, leases: Sequence[LeaseRef], now_ms: int | None = None
    ) -> list[int]:
        """Releases deliveries a consumer did not start, attempts not counted;
        one ReleaseOutcome code per lease."""
        return await self._release(keys, [(lease, False) for lease in leases], now_ms)

    async def _release(
        self, keys: ShardKeys, items: Sequence[tuple[LeaseRef, bool]], now_ms: int | None
    ) -> list[int]:
        codes: list[int] = []
        for start in range(0, len(items), RELEASE_CHUNK):
            chunk = items[start : start + RELEASE_CHUNK]
            args: list[Any] = [keys.prefix, _now_arg(now_ms), shard_channel(keys), len(chunk)]
            for lease, counted in chunk:
                args += [lease.job_id, lease.nonce, 1 if counted else 0]
            out = await self._run("release", [keys.ready, keys.leased, keys.dead, keys.stats], args)
            codes += [int(x) for x in out]
        return codes

    def _all_keys(self, keys: ShardKeys) -> list[str]:
        return [
            keys.index,
            keys.ready,
            keys.leased,
            keys.dead,
            keys.done,
            keys.expiring,
            keys.stats,
        ]

    async def delete(self, keys: ShardKeys, job_id: str) -> tuple[JobState, str]:
        """Removes a job in any state; returns the state it was in and its lease nonce."""
        state, nonce = await self._run(
            "delete", self._all_keys(keys), [keys.prefix, await self._width(keys), job_id]
        )
        if int(state) == 0:
            raise UnknownJob(job_id)
        return JobState(int(state)), _s(nonce)

    async def expire(
        self, keys: ShardKeys, limit: int = EXPIRE_LIMIT, now_ms: int | None = None
    ) -> ExpireResult:
        """Drops TTL-expired jobs and trims completed tombstones."""
        expired, trimmed, next_ms, now = await self._run(
            "expire",
            self._all_keys(keys),
            [
                keys.prefix,
                _now_arg(now_ms),
                await self._width(keys),
                limit,
                await self.completed_retention(keys),
            ],
        )
        return ExpireResult(
            int(expired), int(trimmed), None if next_ms < 0 else int(next_ms), int(now)
        )

    async def dead_action(
        self, keys: ShardKeys, action: str, job_ids: Sequence[str], limit: int
    ) -> int:
        """``redrive`` or ``purge`` the given dead jobs (or up to ``limit`` when none)."""
        return int(
            await self._run(
                "dead",
                [keys.dead, keys.ready, keys.stats],
                [keys.prefix, action, shard_channel(keys), limit, *job_ids],
            )
        )

    async def own(
        self, shards: Sequence[ShardKeys], server_id: str, lease_ms: int, *, give_up: bool = False
    ) -> list[bool]:
        """Takes or keeps (or gives up) the timer ownership lease of each shard.

        Concurrent calls (bounded by the scripts-in-flight gate), not a pipeline:
        redis-py's cluster pipeline cannot load a script a node lacks.
        """
        flag = "1" if give_up else "0"
        out = await asyncio.gather(
            *(self._run("own", [k.owner], [server_id, lease_ms, flag]) for k in shards)
        )
        return [int(x) == 1 for x in out]

    async def heartbeat(
        self, server_id: str, window_ms: int, *, leaving: bool = False
    ) -> list[str]:
        """Marks this replica alive (or gone); returns the ids of live replicas."""
        out = await self._run(
            "replicas", [REPLICAS_KEY], [server_id, window_ms, "1" if leaving else "0"]
        )
        return [_s(x) for x in out]

    # -- reads ------------------------------------------------------------------

    async def get(self, keys: ShardKeys, job_id: str) -> tuple[JobRecord, int]:
        """The job's record and the Redis time it was read at."""
        raw, now = await self._run("read", [keys.record_group(job_id)], [job_id])
        if not raw:
            raise UnknownJob(job_id)
        return records.decode(raw), int(now)

    async def held(self, keys: ShardKeys, leases: Sequence[LeaseRef]) -> list[bool]:
        """Whether each lease is still current (read-only, pipelined)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for lease in leases:
                pipe.hget(keys.record_group(lease.job_id), lease.job_id)
            raws = await pipe.execute()
        out = []
        for lease, raw in zip(leases, raws, strict=True):
            rec = None if raw is None else records.decode(cast(bytes, raw))
            out.append(
                rec is not None and rec.state == JobState.LEASED and rec.nonce == lease.nonce
            )
        return out

    async def has_work(self, shards: Sequence[ShardKeys]) -> list[bool]:
        """Whether each shard has backlog or leases (its promoter or reaper is needed)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for keys in shards:
                pipe.zcard(keys.index)
                pipe.zcard(keys.leased)
            counts = await pipe.execute()
        return [bool(counts[i] or counts[i + 1]) for i in range(0, len(counts), 2)]

    async def shard_stats(self, keys: ShardKeys) -> ShardStats:
        """The shard's counts read by one script, so they describe one instant
        (lua/stats.lua): a job moving between backlog, ready and lease is
        counted exactly once."""
        now, counters_raw, ready, leased, dead, done, oldest, head = await self._run(
            "stats",
            [keys.stats, keys.ready, keys.leased, keys.dead, keys.done, keys.index],
            [keys.prefix],
        )
        counters = {
            _s(k): int(v) for k, v in zip(counters_raw[::2], counters_raw[1::2], strict=True)
        }
        return ShardStats(
            scheduled=max(0, counters.get("backlog", 0)),
            ready=int(ready),
            leased=int(leased),
            dead=int(dead),
            completed=int(done),
            oldest_ready_due_ms=None if int(oldest) < 0 else int(oldest),
            next_due_ms=None if int(head) < 0 else int(head),
            counters=counters,
            now_ms=int(now),
        )

    async def backlog_due(self, keys: ShardKeys, now_ms: int | None = None) -> BacklogDue:
        """The shard's backlog by due time (store/backlog.py)."""
        return await backlog_due(self._run, keys, await self._width(keys), now_ms)

    async def dead_page(
        self, keys: ShardKeys, offset: int, count: int
    ) -> list[tuple[str, JobRecord]]:
        """Dead jobs of a shard by rank (oldest death first)."""
        ids = [_s(x) for x in await self.redis.zrange(keys.dead, offset, offset + count - 1)]
        return await self.records(keys, ids)

    async def records(self, keys: ShardKeys, ids: list[str]) -> list[tuple[str, JobRecord]]:
        """The records of ``ids`` that still exist, in order (one pipeline)."""
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for i in ids:
                pipe.hget(keys.record_group(i), i)
            raws = await pipe.execute()
        return [
            (i, records.decode(cast(bytes, r)))
            for i, r in zip(ids, raws, strict=True)
            if r is not None
        ]

    @staticmethod
    def _check(code: int) -> None:
        if code == -1:
            raise UnknownJob()
        if code == -2:
            raise StaleLease()
