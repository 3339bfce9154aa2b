"""Human durations for flags and env ("250ms", "30s", "5m", "1h", "2d")."""

from __future__ import annotations

import re

_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_ms(text: str) -> int:
    """Parses "1h30m", "250ms" or a bare number of seconds into milliseconds."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return round(float(text) * 1000)
    pos, total = 0, 0.0
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise ValueError(f"not a duration: {text!r} (try 250ms, 30s, 5m, 1h)")
    return round(total)


def parse_signed_ms(text: str) -> int:
    """``parse_ms`` with an optional leading minus ("-5m": five minutes behind)."""
    text = text.strip()
    if text.startswith("-"):
        return -parse_ms(text[1:])
    return parse_ms(text)
