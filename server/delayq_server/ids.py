"""Job ids and lease tokens: formats, generation and parsing."""

from __future__ import annotations

import os
import re
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
# Randomness read from the OS in blocks (one syscall per ~300 ids).
_RANDOM_BLOCK = 4096
_random = b""
_offset = 0


def _random_bytes(n: int) -> bytes:
    """``n`` random bytes, from the block while it lasts (issue 12 profile)."""
    global _random, _offset
    if n > _RANDOM_BLOCK // 4:
        return os.urandom(n)
    if _offset + n > len(_random):
        _random, _offset = os.urandom(_RANDOM_BLOCK), 0
    out = _random[_offset : _offset + n]
    _offset += n
    return out


def _forget_random() -> None:  # a forked child must not repeat its parent's ids
    global _random, _offset
    _random, _offset = b"", 0


os.register_at_fork(after_in_child=_forget_random)


def encode_id(ms: int, rand64: int) -> str:
    """base32hex of the 14 bytes ms(6) + random(8), unpadded: 23 characters."""
    v = (ms << 72) | (rand64 << 8)  # 120 bits = 12 pairs; the 24th digit is padding
    p = _PAIRS
    return (
        p[v >> 110]
        + p[(v >> 100) & 1023]
        + p[(v >> 90) & 1023]
        + p[(v >> 80) & 1023]
        + p[(v >> 70) & 1023]
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


def group_bits(ms: int) -> int:
    """The time-following part of an id's random field, for a creation time in ms."""
    return ((ms >> GROUP_SHIFT) & 31) << 57


# The digits of an id (see encode_id: v = ms << 72 | random << 8, 24 digits of 5
# bits, the last dropped): 0-8 hold ms bits 3-47; 9 holds ms bits 0-2 and two
# random bits; 10 the group bits (group_bits); 11-21 random; 22 two random bits
# and three zero bits. 59 random bits in all. new_job_ids turns random bytes into
# those digits with bytes.translate, a whole call's worth at once: a random byte's
# low 5 (or 2) bits pick the digit.
_B32 = _B32HEX.encode()
_ANY_DIGIT = bytes(_B32[b & 31] for b in range(256))
_DIGIT_9 = [bytes(_B32[(ms_low << 2) | (b & 3)] for b in range(256)) for ms_low in range(8)]
_DIGIT_22 = bytes(_B32[(b & 3) << 3] for b in range(256))


def new_job_ids(count: int) -> list[str]:
    """``count`` fresh ids (the one-shard form) stamped with one clock read.

    The digits ``encode_id`` gives for the creation ms and 59 fresh random bits
    (tests/unit/test_ids.py decodes them back), at a third of the cost per id:
    the ms and group digits are encoded once per call and the random ones come
    from three translate calls (issue 12 profile: ids were an eighth of a
    batch's server time).
    """
    ms = clock.wall_ns() // 1_000_000
    fixed = encode_id(ms, group_bits(ms))
    head, group = fixed[:9], fixed[10]
    rnd = _random_bytes(13 * count)
    d9 = rnd[:count].translate(_DIGIT_9[ms & 7]).decode()
    d22 = rnd[count : 2 * count].translate(_DIGIT_22).decode()
    mid = rnd[2 * count :].translate(_ANY_DIGIT).decode()
    return [head + d9[i] + group + mid[11 * i : 11 * i + 11] + d22[i] for i in range(count)]


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
