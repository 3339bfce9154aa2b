"""The operation history: invoke/ok/fail/info records, one JSON object per line."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import grpc

# Outcome kinds (Jepsen's): "invoke" starts an operation; "ok" and "fail" say it
# did or did not take effect; "info" says the outcome is unknown. An invoke that
# never completes (its process was killed) counts as "info".
INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"

# Codes after which a non-idempotent call may or may not have taken effect.
INDEFINITE_CODES = frozenset(
    {
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
    }
)


@dataclass(slots=True)
class Op:
    """One history record. Times are milliseconds: ``t`` on the client's wall clock,
    ``due``, ``claim`` and ``deadline`` on the server's (Redis TIME)."""

    process: str
    type: str  # invoke | ok | fail | info
    f: str  # enqueue | deliver | ack | nack | delete | stream | nemesis | final
    t: float
    op: str = ""  # pairs an invoke with its completion
    key: str = ""  # the producer's own name for the job, carried in the payload
    job: str = ""
    due: int | None = None  # the server's due time of the job (ms)
    want_due: float | None = None  # earliest due the producer asked for (client ms)
    claim: int | None = None  # server time of the delivery (job.last_delivery_time)
    deadline: int | None = None  # lease deadline of the delivery (server ms)
    token: str = ""
    attempt: int | None = None
    max_attempts: int | None = None
    payload_ok: bool | None = None
    result: str = ""  # ACKED/STALE/UNKNOWN, a final state, a status code name
    target: str = ""  # nemesis: the process acted on

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v not in (None, "")})

    @staticmethod
    def from_json(line: str) -> Op:
        raw: dict[str, Any] = json.loads(line)
        return Op(**{k: v for k, v in raw.items() if k in _FIELDS})


_FIELDS = frozenset(f.name for f in fields(Op))


def now_ms() -> float:
    return time.time() * 1000


class Recorder:
    """Appends ops to a file, one write per line, so a SIGKILL loses at most the
    line being written. Thread-safe."""

    def __init__(self, path: Path, process: str) -> None:
        self.process = process
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self._seq = 0

    def next_op_id(self) -> str:
        with self._lock:
            self._seq += 1
            # The pid tells a restarted process's ops from its predecessor's.
            return f"{self.process}:{os.getpid()}:{self._seq}"

    def record(self, type_: str, f: str, **kw: Any) -> Op:
        op = Op(process=self.process, type=type_, f=f, t=now_ms(), **kw)
        line = (op.to_json() + "\n").encode()
        with self._lock:
            os.write(self._fd, line)
        return op

    def close(self) -> None:
        os.close(self._fd)


def outcome_of(err: grpc.RpcError) -> tuple[str, str]:
    """("info" or "fail", code name) for a failed call."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    return (INFO if code in INDEFINITE_CODES else FAIL), code.name


def read(paths: Iterable[Path]) -> Iterator[Op]:
    """Every op in the files; a torn last line (SIGKILL mid-write) is skipped."""
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                yield Op.from_json(line)
            except json.JSONDecodeError:
                continue


def load(directory: Path) -> list[Op]:
    """The merged history of a run, ordered by client time."""
    return sorted(read(sorted(directory.glob("*.jsonl"))), key=lambda o: o.t)
