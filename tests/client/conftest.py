"""Fixtures for client tests: a real delayq server process on the session's real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import DelayqProcess

# Short retry backoff and reaper-visible leases keep the failure tests quick.
SERVER_ARGS = ["--retry-initial", "100ms", "--grace", "2s", "--log-level", "WARNING"]


@pytest.fixture
def delayq_server(redis_url: str) -> Iterator[DelayqProcess]:
    """A fresh server process per test, on a flushed Redis."""
    with DelayqProcess(redis_url, SERVER_ARGS) as proc:
        yield proc


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
