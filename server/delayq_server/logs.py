"""Server logs: text or JSON lines (``--log-format``), with trace and span ids.

Notable events (stream opened/closed, lease expired, job dead-lettered, Redis
reconnected) are logged through ``event`` with their fields; both formats
print them, JSON as keys of the line. Fields are ids, names, counts, peer
addresses and reasons: never payloads, headers or tokens (tests/e2e/test_logs.py).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from opentelemetry import trace

FORMATS = ("text", "json")
_FIELDS = "delayq_fields"
_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_FIELD_CHARS = 512  # a client-given reason is cut here


def event(logger: logging.Logger, name: str, message: str, **fields: Any) -> None:
    """One INFO line for a notable event; ``fields`` become JSON keys (or key=value)."""
    if not logger.isEnabledFor(logging.INFO):
        return
    clean = {
        k: (v[:MAX_FIELD_CHARS] if isinstance(v, str) else v)
        for k, v in fields.items()
        if v is not None
    }
    logger.info(message, extra={_FIELDS: {"event": name, **clean}})


def _trace_ids() -> dict[str, str]:
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}


class JsonFormatter(logging.Formatter):
    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(getattr(record, _FIELDS, {}))
        line.update(_trace_ids())
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(_TEXT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extra = {**getattr(record, _FIELDS, {}), **_trace_ids()}
        if not extra:
            return text
        pairs = " ".join(f"{k}={v}" for k, v in extra.items())
        first, sep, rest = text.partition("\n")  # after the message, before a traceback
        return f"{first} {pairs}{sep}{rest}"


def setup(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
