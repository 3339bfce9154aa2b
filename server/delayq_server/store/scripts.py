"""Loads the Lua scripts from ``lua/*.lua``, expanding ``-- @include name`` lines."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)

NAMES = (
    "ack",
    "claim",
    "dead",
    "delete",
    "enqueue",
    "expire",
    "extend",
    "nack",
    "promote",
    "reap",
    "release",
)

# How long a script's reply is kept for a re-sent call (includes/replay.lua).
# It must outlast the Redis client's retry schedule (app.py: at most
# REDIS_RETRIES x (backoff cap + connect timeout), about 9 s), with margin;
# every call's entry costs ~100-200 bytes for this long (docs/decisions.md).
REPLAY_TTL_MS = 30_000

# Scripts that handle replays themselves (claim stores ids and nonces only, not
# the records it delivers). Every other script is wrapped whole by _GUARD.
SELF_GUARDED = frozenset({"claim"})

_GUARD = """-- @include replay
local replay_prev = replay_get()
if replay_prev then return replay_prev end
local function replay_body()
{body}
end
local replay_out = replay_body()
replay_put(replay_out)
return replay_out
"""


def _read(relative: str) -> str:
    return resources.files("delayq_server").joinpath("lua", relative).read_text("utf-8")


def _expand(text: str) -> str:
    text = _INCLUDE.sub(lambda m: _read(f"includes/{m.group(1)}.lua"), text)
    return text.replace("@REPLAY_TTL_MS@", str(REPLAY_TTL_MS))


@cache
def source(name: str) -> str:
    """The script's text with its includes inlined (Redis has no module system).

    Every script changes state, so each is made safe to re-send: its last KEY
    is the call's request key (includes/replay.lua).
    """
    text = _read(f"{name}.lua")
    if name not in SELF_GUARDED:
        text = _GUARD.format(body=text)
    return _expand(text)
