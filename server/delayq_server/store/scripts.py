"""Loads the Lua scripts from ``lua/*.lua``, expanding ``-- @include name`` lines."""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)

NAMES = (
    "ack",
    "backlog",
    "claim",
    "dead",
    "delete",
    "drop_shard",
    "enqueue",
    "expire",
    "extend",
    "nack",
    "own",
    "pause",
    "promote",
    "purge",
    "reap",
    "read",
    "replicas",
    "release",
    "reschedule",
    "retain",
    "stats",
    "update_job",
)

# Scripts that record lifecycle events: their last argument is the events
# stream's MAXLEN, 0 = off (lua/includes/events.lua). Store._run appends it.
RECORDS_EVENTS = frozenset(
    {"ack", "claim", "dead", "delete", "enqueue", "expire", "nack", "purge", "reap", "release"}
)

# How long a script's reply is kept for a re-sent call (includes/replay.lua).
# It must outlast the Redis client's retry schedule (redis_client.py: at most
# RETRIES x (backoff cap + connect timeout) in redis_client.py, about 9 s), with margin;
# every call's entry costs ~100-200 bytes for this long (docs/decisions.md).
REPLAY_TTL_MS = 30_000

# Scripts that handle replays themselves (claim stores ids and nonces only, not
# the records it delivers; enqueue stores "now" and its duplicates only). Every
# other replayed script is wrapped by _GUARD.
SELF_GUARDED = frozenset({"claim", "enqueue"})
# Not replayed: a re-run is harmless and their replies are only counts and next
# times the calling loop reads again (promote and expire are conditional on
# Redis' clock). They run often on every replica, so they write no entries.
NOT_REPLAYED = frozenset({"promote", "expire"})
# Not replayed either: reads, and liveness scripts whose re-run sets the same
# lease or heartbeat again (own.lua, replicas.lua: ARGV[1] is no shard prefix).
NOT_REPLAYED |= {"read", "own", "replicas", "backlog", "stats"}
# retain (the janitor's dead-letter retention) deletes only what is still over
# its bounds, so a re-run is harmless like expire.
NOT_REPLAYED |= {"retain"}
REPLAYED = frozenset(NAMES) - NOT_REPLAYED
# Quota scripts (store/quotas.py) are not replayed either: a re-sent
# quota_queue or quota_stream is idempotent, and a re-sent quota_rate at worst
# takes a call's tokens twice, erring on the safe side. They are not in NAMES.
QUOTA_NAMES = ("quota_queue", "quota_rate", "quota_stream")
assert SELF_GUARDED <= REPLAYED  # their request key is the last KEY

# A body may return a second value, false, when it changed nothing (a refusal,
# an empty sweep): a re-run is then harmless and nothing is stored, so refused
# requests leave Redis untouched.
_GUARD = """-- @include replay
local replay_prev = replay_get()
if replay_prev then return replay_prev end
local function replay_body()
{body}
end
local replay_out, replay_changed = replay_body()
if replay_changed ~= false then replay_put(replay_out) end
return replay_out
"""


def _read(relative: str) -> str:
    return resources.files("delayq_server").joinpath("lua", relative).read_text("utf-8")


def expand(text: str, read: Callable[[str], str] = _read) -> str:
    """``text`` with its includes inlined, each read by ``read`` (a path under lua/;
    bench/enqueue_script_ab.py reads another commit's)."""
    # Includes may include others (record -> clock); each is a small fixed file.
    text = _INCLUDE.sub(lambda m: expand(read(f"includes/{m.group(1)}.lua"), read), text)
    return text.replace("@REPLAY_TTL_MS@", str(REPLAY_TTL_MS))


@cache
def source(name: str) -> str:
    """The script's text with its includes inlined (Redis has no module system).

    Scripts in REPLAYED are made safe to re-send: their last KEY is the call's
    request key (includes/replay.lua).
    """
    text = _read(f"{name}.lua")
    if name in REPLAYED and name not in SELF_GUARDED:
        text = _GUARD.format(body=text)
    return expand(text)
