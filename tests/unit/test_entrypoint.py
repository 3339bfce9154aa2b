"""The server's entry point picks gRPC's listener before grpc loads (docs/decisions.md,
"the gRPC listener")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Records GRPC_EXPERIMENTS as it is when grpc is first imported, then imports the
# entry point as `python -m delayq_server` and the `delayq-server` script do.
_PROBE = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc" and not seen:
            seen.append(os.environ.get("GRPC_EXPERIMENTS", "<unset>"))
        return None
sys.meta_path.insert(0, Spy())
import delayq_server.__main__
print(seen[0] if seen else "<grpc never imported>")
"""


def _seen(extra: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"} | extra
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_the_iomgr_listener_is_chosen_before_grpc_loads() -> None:
    assert _seen({}) == "-event_engine_listener"


@pytest.mark.parametrize("value", ["event_engine_listener", ""])
def test_an_operators_grpc_experiments_wins(value: str) -> None:
    assert _seen({"GRPC_EXPERIMENTS": value}) == value
