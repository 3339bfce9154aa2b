"""Run a command against a fresh redis-server and delayq server on free ports.

    python scripts/with_server.py [--server-arg=--flag=value ...] -- go test ./...

The command sees DELAYQ_ADDR (host:port of the gRPC server) and
DELAYQ_REDIS_URL; both processes are stopped afterwards and the command's exit
code is returned.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.servers import DelayqProcess, ManagedRedis


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-arg", action="append", default=[], help="extra server flag")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    ns = parser.parse_args()
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if not command:
        parser.error("give a command after --")
    with (
        tempfile.TemporaryDirectory(prefix="delayq-") as tmp,
        ManagedRedis(Path(tmp), appendonly=False) as redis,
        DelayqProcess(redis.url, ns.server_arg) as server,
    ):
        env = {**os.environ, "DELAYQ_ADDR": server.address, "DELAYQ_REDIS_URL": redis.url}
        return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
