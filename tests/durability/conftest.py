"""Builds the unsynced-writes shim (a power cut for Redis' AOF on kill -9) with gcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("unsynced_writes.c")


@pytest.fixture(scope="session")
def unsynced_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of the LD_PRELOAD library; a missing compiler fails loudly (no skip)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    assert cc, "the durability suite needs a C compiler (apt-get install gcc)"
    out = tmp_path_factory.mktemp("shim") / "unsynced_writes.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(SOURCE), "-ldl", "-lpthread"],
        check=True,
    )
    return out
