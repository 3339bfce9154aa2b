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
    "quota_queue",
    "quota_rate",
    "quota_stream",
    "reap",
    "release",
)


def _read(relative: str) -> str:
    return resources.files("delayq_server").joinpath("lua", relative).read_text("utf-8")


@cache
def source(name: str) -> str:
    """The script's text with its includes inlined (Redis has no module system)."""
    return _expand(_read(f"{name}.lua"))


def _expand(text: str) -> str:
    # Includes may include others (record -> clock); each is a small fixed file.
    return _INCLUDE.sub(lambda m: _expand(_read(f"includes/{m.group(1)}.lua")), text)
