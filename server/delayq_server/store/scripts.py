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

# Scripts that record lifecycle events: their last argument is the events
# stream's MAXLEN, 0 = off (lua/includes/events.lua). Store._run appends it.
RECORDS_EVENTS = frozenset(
    {"ack", "claim", "dead", "delete", "enqueue", "expire", "nack", "reap", "release"}
)


def _read(relative: str) -> str:
    return resources.files("delayq_server").joinpath("lua", relative).read_text("utf-8")


@cache
def source(name: str) -> str:
    """The script's text with its includes inlined (Redis has no module system)."""
    text = _read(f"{name}.lua")
    return _INCLUDE.sub(lambda m: _read(f"includes/{m.group(1)}.lua"), text)
