"""DELAYQ_ADDR: the one address setting of the Python client, worker, CLI and examples."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from delayq import Client
from delayq._channel import DEFAULT_TARGET, resolve_target


def test_resolution_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DELAYQ_ADDR", raising=False)
    monkeypatch.delenv("DELAYQ_TARGET", raising=False)
    assert resolve_target(None) == DEFAULT_TARGET
    monkeypatch.setenv("DELAYQ_TARGET", "old:1")  # deprecated alias
    assert resolve_target(None) == "old:1"
    monkeypatch.setenv("DELAYQ_ADDR", "new:2")
    assert resolve_target(None) == "new:2"
    assert resolve_target("given:3") == "given:3"


def test_client_and_cli_read_delayq_addr(
    target: str, cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DELAYQ_ADDR", target)
    with Client() as client:
        job_id = client.enqueue("addr-env", b"x").job_id
    env = {**os.environ, "DELAYQ_ADDR": target}
    out = subprocess.run(
        [str(cli), "get", "addr-env", job_id], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    assert job_id in out.stdout
