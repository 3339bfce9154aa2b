"""Job ids and lease tokens: formats, generation and parsing."""

from __future__ import annotations

import base64
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


def new_job_id(shard: int, shards: int) -> str:
    """A fresh id; queues with several shards carry the shard as a ``-N`` suffix."""
    raw = (clock.wall_ns() // 1_000_000).to_bytes(6, "big") + os.urandom(8)
    text = base64.b32hexencode(raw).decode().rstrip("=").lower()
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
