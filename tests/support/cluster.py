"""A real Redis Cluster on loopback ports, from the same redis-server binary.

Three masters (and optionally one replica each) with their cluster bus on ports
of their own (``--cluster-port``), so nothing assumes port + 10000 is free.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from delayq_server.managed_redis import ManagedRedis, free_port


class ManagedCluster:
    """Starts N masters (+ replicas), joins them with ``redis-cli --cluster create``."""

    def __init__(self, data_dir: Path, masters: int = 3, replicas: int = 0) -> None:
        self.data_dir = data_dir
        self.masters = masters
        self.replicas = replicas
        self.nodes: list[ManagedRedis] = []

    @property
    def url(self) -> str:
        """The server's URL for cluster mode: any node seeds the slot map."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def seed_url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster.from_url(self.seed_url)

    def start(self, timeout: float = 30.0) -> ManagedCluster:
        count = self.masters * (1 + self.replicas)
        for i in range(count):
            node = ManagedRedis(
                self.data_dir / f"node{i}",
                appendonly=False,
                extra=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "1000",
                    "--cluster-port", str(free_port()),
                    # A replica may take over however long it was cut off: in a
                    # test the master is killed right after the replica synced.
                    "--cluster-replica-validity-factor", "0",
                ],
            )  # fmt: skip
            self.nodes.append(node.start())
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli not found: install redis-tools (make system-deps)")
        subprocess.run(
            [
                cli, "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas", str(self.replicas), "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )  # fmt: skip
        self._wait_ok(timeout)
        return self

    def _wait_ok(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = []
            for n in self.nodes:
                with redis.Redis(port=n.port) as c:
                    info: dict[str, object] = c.execute_command("CLUSTER INFO")
                    states.append(info.get("cluster_state") == "ok")
                    # A replica counts only once its first sync finished, or a
                    # master killed by a test would have nobody to fail over to.
                    repl: dict[str, object] = c.info("replication")
                    if repl.get("role") == "slave":
                        states.append(repl.get("master_link_status") == "up")
            if all(states):
                return
            time.sleep(0.05)
        raise RuntimeError(f"cluster did not reach state ok within {timeout}s")

    def master_of(self, key: str) -> ManagedRedis:
        """The node that serves the slot of ``key`` now."""
        with self.client() as c:
            node = c.get_node_from_key(key)
        return next(n for n in self.nodes if n.port == node.port)

    def flushall(self) -> None:
        with self.client() as c:
            c.flushall(target_nodes=redis.RedisCluster.PRIMARIES)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> ManagedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
