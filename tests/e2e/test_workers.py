"""`--workers N`: several server processes on one port, never a silent double bind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, free_port, wait_until


@pytest.fixture
def group(redis_server: ManagedRedis) -> Iterator[DelayqProcess]:
    with DelayqProcess(redis_server.url, ["--workers", "2"]) as proc:
        yield proc


def _server_id(address: str, queue: str) -> str:
    """The id of the worker a fresh connection lands on, from a lease nonce."""
    with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        stub.Enqueue(service_pb2.EnqueueRequest(queue=queue, payload=b"x"), timeout=10)
        call = stub.Consume(service_pb2.ConsumeRequest(queues=[queue], max_outstanding=1))
        d = next(iter(call)).deliveries[0]
        stub.Ack(service_pb2.AckRequest(lease_tokens=[d.lease_token]), timeout=10)
        call.cancel()  # type: ignore[no-untyped-call]
    return d.lease_token.rsplit("/", 1)[1].split(".")[0]


def test_connections_spread_over_the_workers(group: DelayqProcess, queue: str) -> None:
    ids = {_server_id(group.address, queue) for _ in range(16)}
    assert len(ids) == 2, ids  # the kernel spread 16 connections over both workers


def test_a_second_server_on_the_port_is_refused(
    group: DelayqProcess, redis_server: ManagedRedis
) -> None:
    for extra in (["--workers", "2"], []):
        out = subprocess.run(
            [sys.executable, "-m", "delayq_server", "--redis-url", redis_server.url,
             "--listen", group.address, *extra],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert out.stderr.startswith("delayq-server: error: "), out.stderr
        assert "Traceback" not in out.stderr


def test_sigterm_stops_the_group_and_sigkill_takes_the_workers_along(
    redis_server: ManagedRedis,
) -> None:
    proc = DelayqProcess(redis_server.url, ["--workers", "2"]).start()
    assert proc.terminate() == 0
    proc = DelayqProcess(redis_server.url, ["--workers", "2"]).start()
    assert proc.proc is not None
    children = [
        int(p)
        for p in subprocess.run(
            ["pgrep", "-P", str(proc.proc.pid)], capture_output=True, text=True
        ).stdout.split()
    ]
    assert len(children) == 2
    proc.kill()

    def gone(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        # A zombie (exited, not yet reaped by init) counts as gone too.
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1].startswith("Z")

    wait_until(lambda: all(gone(p) for p in children), 15)
    assert signal.SIGTERM  # the parent-death signal the workers get


def test_each_worker_serves_its_own_admin_port(redis_server: ManagedRedis) -> None:
    """Worker i serves --http-listen's port + i: N workers never fight over one port."""

    def consecutive_free() -> int:
        while True:
            port = free_port()
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port

    base = consecutive_free()
    args = ["--workers", "2", "--http-listen", f"127.0.0.1:{base}"]
    with DelayqProcess(redis_server.url, args) as proc:
        lines = [line for line in proc.output if "admin http on" in line]
        assert sorted(line.split("] ", 1)[0] + "]" for line in lines) == [
            "[worker 0]",
            "[worker 1]",
        ]
        assert {int(line.rsplit(":", 1)[1]) for line in lines} == {base, base + 1}
        for port in (base, base + 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                assert b"target_info" in resp.read()
