"""Fixtures for client tests: a real delayq server process on the session's real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import DelayqProcess

# Short retry backoff and reaper-visible leases keep the failure tests quick.
SERVER_ARGS = ["--retry-initial", "100ms", "--grace", "2s", "--log-level", "WARNING"]


class ServerProcess(DelayqProcess):
    """DelayqProcess that also closes the stdout pipe of every process it started.

    (tests.support.servers leaves the pipe open, which pytest's warnings-as-errors
    turns into a failure once the process object is collected.)
    """

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            if self._reader is not None:
                self._reader.join(5)
            if self.proc.stdout is not None:
                self.proc.stdout.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self._close_pipe()
        super().start(timeout)
        return self

    def kill(self) -> None:
        super().kill()
        self._close_pipe()

    def terminate(self, timeout: float = 30.0) -> int:
        code = super().terminate(timeout)
        self._close_pipe()
        return code


@pytest.fixture
def delayq_server(redis_url: str) -> Iterator[ServerProcess]:
    """A fresh server process per test, on a flushed Redis."""
    proc = ServerProcess(redis_url, SERVER_ARGS)
    with proc:
        yield proc
    proc._close_pipe()


@pytest.fixture
def target(delayq_server: DelayqProcess) -> str:
    """host:port of the running server."""
    return delayq_server.address


@pytest.fixture
def cli() -> Path:
    """The installed `delayq` console script."""
    import sys

    path = Path(sys.executable).parent / "delayq"
    assert path.exists(), f"console script missing at {path}: run `make deps`"
    return path
