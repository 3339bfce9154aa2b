"""Job ids and lease tokens: formats, generation and parsing."""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from delayq_server import clock
from delayq_server.store import LeaseRef, ShardKeys

# 48-bit ms timestamp + 64 random bits, base32hex: 23 chars, time-sortable.
# Collisions need two ids in the same millisecond with equal 64-bit randoms.
_JOB_ID = re.compile(r"^[0-9a-v]{23}(?:-(\d{1,4}))?$")
_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_TOKEN = re.compile(rf"^({_NAME})/({_NAME})/(\d{{1,4}})/([0-9a-v]{{23}}(?:-\d{{1,4}})?)/([\w.]+)$")


# Two base32hex digits per 10 bits: encoding by table lookups costs a fifth of
# base64.b32hexencode, which ran byte by byte in Python (issue 12 profile).
_B32HEX = "0123456789abcdefghijklmnopqrstuv"
_PAIRS = [a + b for a in _B32HEX for b in _B32HEX]
# Randomness read from the OS in blocks, 8 bytes per id (one syscall per 512 ids).
_RANDOM_BLOCK = 4096
_random = memoryview(b"")
_offset = 0


def _random64s(count: int) -> tuple[int, ...]:
    """``count`` random 64-bit values: one unpack for a whole batch (issue 12 profile)."""
    global _random, _offset
    if count * 8 > _RANDOM_BLOCK:
        return struct.unpack(f">{count}Q", os.urandom(count * 8))
    if _offset + count * 8 > len(_random):
        _random, _offset = memoryview(os.urandom(_RANDOM_BLOCK)), 0
    values = struct.unpack_from(f">{count}Q", _random, _offset)
    _offset += count * 8
    return values


def _forget_random() -> None:  # a forked child must not repeat its parent's ids
    global _random, _offset
    _random, _offset = memoryview(b""), 0


os.register_at_fork(after_in_child=_forget_random)


def encode_id(ms: int, rand64: int) -> str:
    """base32hex of the 14 bytes ms(6) + random(8), unpadded: 23 characters."""
    return _head(ms) + _tail(((ms & 255) << 72) | (rand64 << 8))


# The id as one 120-bit number v = ms << 72 | random << 8 is 12 digit pairs (the
# 24th digit is padding). The first 4 pairs (v >> 80) hold ms bits 8-47 only, so
# ids made in one ms share them: _head encodes them once per call (new_job_ids).
def _head(ms: int) -> str:
    p, v = _PAIRS, ms >> 8
    return p[v >> 30] + p[(v >> 20) & 1023] + p[(v >> 10) & 1023] + p[v & 1023]


def _tail(v: int) -> str:
    """The last 15 digits, from v's bits 0-79 (the ms' low 8 bits and the random)."""
    p = _PAIRS
    return (
        p[v >> 70]
        + p[(v >> 60) & 1023]
        + p[(v >> 50) & 1023]
        + p[(v >> 40) & 1023]
        + p[(v >> 30) & 1023]
        + p[(v >> 20) & 1023]
        + p[(v >> 10) & 1023]
        + p[v & 1023][0]
    )


# An id's record group (characters 11-12, keys.py record_group) is 10 bits of
# its random part. The upper 5 (character 11) follow the creation time: ids made
# in the same GROUP_WINDOW_MS spread over 32 of a shard's 1,024 groups, and the
# windows take turns every 32 windows (~0.5 s). Jobs enqueued together are
# stored together, so a big backlog's enqueues (and the claims of jobs that fall
# due together) touch a few warm hashes instead of a thousand cold ones: in a
# 10M backlog an HSET into one of 32 groups cost what it costs in an empty Redis,
# into one of 1,024 ~1.6x that. A backlog built over more than one turn still
# fills every group evenly, so small groups stay compact (listpack). The other 59
# random bits keep ids unique and unguessable; ids made before keep their fully
# random group bits, which still name their group (docs/decisions.md, "record
# groups follow creation time").
GROUP_SHIFT = 4  # ms -> window: 16 ms windows
GROUP_WINDOW_MS = 1 << GROUP_SHIFT
_TIME_BITS = 31 << 57  # bits 57-61 of the random part: id character 11


def group_bits(ms: int) -> int:
    """The time-following part of an id's random field, for a creation time in ms."""
    return ((ms >> GROUP_SHIFT) & 31) << 57


def new_job_ids(count: int) -> list[str]:
    """``count`` fresh ids (the one-shard form) stamped with one clock read.

    The same digits as ``encode_id``, cheaper per id: all ids of a call share the
    ms, so its head and the group bits are worked out once (issue 12 profile: ids
    were an eighth of a batch's server time).
    """
    ms = clock.wall_ns() // 1_000_000
    head, low_ms = _head(ms), (ms & 255) << 72
    keep, group = ~_TIME_BITS, group_bits(ms)
    return [head + _tail(low_ms | (((r & keep) | group) << 8)) for r in _random64s(count)]


def new_job_id(shard: int, shards: int) -> str:
    """A fresh id; queues with several shards carry the shard as a ``-N`` suffix."""
    (text,) = new_job_ids(1)
    return with_shard(text, shard, shards)


def with_shard(text: str, shard: int, shards: int) -> str:
    """An id from ``new_job_ids`` placed in ``shard`` of a queue with ``shards``."""
    return text if shards <= 1 else f"{text}-{shard}"


def created_ms(job_id: str) -> int | None:
    """The wall-clock ms a job id was made at (its first 48 bits), or None when malformed."""
    head = job_id[:10]  # 10 base32hex digits = 50 bits: the 48-bit time, 2 random bits
    try:
        return int(head, 32) >> 2 if len(head) == 10 else None
    except ValueError:
        return None


def shard_of(job_id: str) -> int | None:
    """The shard a job id lives in, or None when the id is malformed."""
    m = _JOB_ID.match(job_id)
    if not m:
        return None
    return int(m.group(1)) if m.group(1) else 0


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """A parsed lease token: where the job lives and the fencing nonce."""

    keys: ShardKeys
    job_id: str
    nonce: str

    @property
    def ref(self) -> LeaseRef:
        return LeaseRef(self.job_id, self.nonce)

    @property
    def server_id(self) -> str:
        return self.nonce.split(".", 1)[0]

    @property
    def stream_seq(self) -> str:
        parts = self.nonce.split(".")
        return parts[1] if len(parts) > 1 else ""

    def __str__(self) -> str:
        return f"{self.keys.tag}/{self.job_id}/{self.nonce}"


def parse_token(token: str) -> LeaseToken | None:
    m = _TOKEN.match(token)
    if not m:
        return None
    ns, queue, shard, job_id, nonce = m.groups()
    return LeaseToken(ShardKeys(ns, queue, int(shard)), job_id, nonce)


def format_token(keys: ShardKeys, job_id: str, nonce: str) -> str:
    return f"{keys.tag}/{job_id}/{nonce}"
