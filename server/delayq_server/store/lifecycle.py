"""Lifecycle events: what the scripts XADD to each shard's stream (``--record-events``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["EVENT_KINDS", "LifecycleEvent", "decode_event"]

# The scripts write these names (lua/includes/events.lua); readers (the data
# pipeline's export, tests) decode with decode_event. Never rename: exported
# Parquet keeps them.
EVENT_KINDS = (
    "enqueued",  # stored (not a duplicate): due = its due time
    "delivered",  # claimed by a stream: attempt = this delivery's number
    "acked",  # completed
    "nacked",  # retry scheduled by Nack or an expired lease (reason says which)
    "released",  # handed back by a closed stream (attempt not counted when unsent)
    "expired",  # TTL reached before completion
    "dead",  # dead-lettered (reason = the last error)
    "deleted",  # removed by Delete or a purge of the dead set
    "redriven",  # dead job put back to ready
)


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One stream entry. Times are Redis-clock epoch ms; 0 = not known."""

    kind: str
    job_id: str
    time_ms: int
    due_ms: int
    created_ms: int
    attempt: int
    reason: str


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def decode_event(fields: Mapping[Any, Any]) -> LifecycleEvent:
    """A stream entry's fields (``e j t d c a r``) as an event."""
    f = {_text(k): _text(v) for k, v in fields.items()}
    return LifecycleEvent(
        kind=f["e"],
        job_id=f["j"],
        time_ms=int(f.get("t") or 0),
        due_ms=int(f.get("d") or 0),
        created_ms=int(f.get("c") or 0),
        attempt=int(f.get("a") or 0),
        reason=f.get("r", ""),
    )
