"""Prints the server's runtime requirements (its pyproject and the Python client's).

`make run` and the Dockerfile install these first, then the two packages with
--no-deps: the dependency layer (or stamp) changes only with a pyproject, and
no development tool is installed (requirements-dev.txt is `make deps`' alone).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCAL = {"delayq", "delayq-server"}  # installed from source, not the index


def main() -> None:
    for project in ("clients/python", "server"):
        with open(ROOT / project / "pyproject.toml", "rb") as f:
            deps = tomllib.load(f)["project"]["dependencies"]
        for dep in deps:
            if dep.split("[")[0].split("=")[0].split(">")[0].split("<")[0] not in LOCAL:
                print(dep)


if __name__ == "__main__":
    main()
