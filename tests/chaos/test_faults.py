"""The short fault suite: each fault once, fixed seed, judged by the checker.

``make chaos`` runs the long soak (tests/chaos/soak.py); docs/chaos.md has both.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import faults

SEED = 8


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault", faults.FAULTS, ids=[f.name for f in faults.FAULTS])
def test_fault_keeps_every_promise(fault: faults.Fault, tmp_path: Path) -> None:
    rep = faults.run(fault, tmp_path, seed=SEED)
    print(rep.summary())  # the table, with -s or on failure
    print(f"history: {tmp_path / 'history'}")
    assert rep.info["drained"], (
        "jobs were still pending when the drain deadline passed\n" + rep.summary()
    )
    assert not rep.failed, rep.summary()
