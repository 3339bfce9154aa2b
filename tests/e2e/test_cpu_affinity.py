"""`--cpu-affinity`: each server process keeps its threads on one CPU, off by default
(server/delayq_server/cpu_affinity.py; docs/decisions.md, "one CPU per server process")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from delayq.v1 import service_pb2, service_pb2_grpc
from delayq_server import config, cpu_affinity
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, wait_until

ALLOWED = sorted(os.sched_getaffinity(0))


def _thread_cpus(pid: int) -> dict[int, str]:
    """Each thread of `pid` -> the CPUs it may run on, as /proc lists them."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
        out[int(tid)] = line.split(":", 1)[1].strip()
    return out


def _serve_one_call(address: str, queue: str) -> None:
    """An Enqueue, so grpc's lazily started threads exist before the check."""
    with grpc.insecure_channel(address) as ch:
        stub = service_pb2_grpc.DelayQueueServiceStub(ch)
        stub.Enqueue(service_pb2.EnqueueRequest(queue=queue, payload=b"x"), timeout=10)


def _workers(supervisor: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(supervisor)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


@pytest.mark.parametrize(
    ("spec", "allowed", "want"),
    [
        ("off", {0, 1}, []),
        ("auto", {3, 1, 2}, [1, 2, 3]),
        ("2", {0, 1, 2, 3}, [2]),
        ("3,1", {0, 1, 2, 3}, [3, 1]),
        ("0-2", {0, 1, 2, 3}, [0, 1, 2]),
        (" 1 , 1-2 ", {0, 1, 2}, [1, 2]),
    ],
)
def test_the_cpus_a_value_names(spec: str, allowed: set[int], want: list[int]) -> None:
    assert cpu_affinity.cpus(spec, allowed) == want


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("4", "CPU 4 is not one this process may use (0-2,5)"),
        ("1-3", "CPU 3 is not one this process may use (0-2,5)"),
        ("two", "'two' is not a CPU number or range: want off, auto, or a list"),
        ("2-1", "'2-1': a range runs from low to high"),
        ("1,", "'' is not a CPU number or range"),
        ("-1", "'-1' is not a CPU number or range"),
    ],
)
def test_a_value_naming_no_usable_cpu_is_refused(spec: str, message: str) -> None:
    with pytest.raises(cpu_affinity.AffinityError, match="^" + re.escape(message)):
        cpu_affinity.cpus(spec, {0, 1, 2, 5})


def test_workers_take_the_listed_cpus_in_turn() -> None:
    allowed = ",".join(map(str, ALLOWED))
    assert [cpu_affinity.for_worker(allowed, i) for i in range(len(ALLOWED) + 1)] == [
        *map(str, ALLOWED),
        str(ALLOWED[0]),
    ]
    assert cpu_affinity.for_worker("off", 3) == "off"


def test_it_is_off_unless_asked_for() -> None:
    assert config.load([], env={}).cpu_affinity == "off"
    assert config.load([], env={"DELAYQ_CPU_AFFINITY": "auto"}).cpu_affinity == "auto"


def test_the_server_refuses_a_cpu_it_may_not_use(redis_server: ManagedRedis) -> None:
    cpu = max(ALLOWED) + 1
    out = subprocess.run(
        [sys.executable, "-m", "delayq_server", "--redis-url", redis_server.url,
         "--listen", "127.0.0.1:0", "--cpu-affinity", str(cpu)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(
        f"delayq-server: error: --cpu-affinity: CPU {cpu} is not one this process may use"
    ), out.stderr


def test_by_default_the_server_may_run_on_every_cpu(server: DelayqProcess, queue: str) -> None:
    assert server.proc is not None
    _serve_one_call(server.address, queue)
    mine = _thread_cpus(os.getpid())[os.getpid()]
    assert set(_thread_cpus(server.proc.pid).values()) == {mine}


def test_every_thread_of_the_server_stays_on_the_cpu_named(
    redis_server: ManagedRedis, queue: str
) -> None:
    cpu = ALLOWED[-1]
    with DelayqProcess(redis_server.url, ["--cpu-affinity", str(cpu)]) as server:
        assert server.proc is not None
        _serve_one_call(server.address, queue)
        threads = _thread_cpus(server.proc.pid)
        assert len(threads) > 1  # grpc's threads are there, not only the main one
        assert set(threads.values()) == {str(cpu)}, threads


def test_workers_spread_over_the_cpus_one_each(redis_server: ManagedRedis, queue: str) -> None:
    assert len(ALLOWED) >= 2, "this test needs a machine with two CPUs"
    with DelayqProcess(redis_server.url, ["--workers", "2", "--cpu-affinity", "auto"]) as group:
        assert group.proc is not None
        supervisor = group.proc.pid
        for _ in range(8):  # connections land on both workers
            _serve_one_call(group.address, queue)
        wait_until(lambda: len(_workers(supervisor)) == 2)
        per_worker = [set(_thread_cpus(pid).values()) for pid in _workers(supervisor)]
        assert sorted(per_worker, key=sorted) == [{str(ALLOWED[0])}, {str(ALLOWED[1])}]
        # The supervisor itself is left where it was.
        mine = _thread_cpus(os.getpid())[os.getpid()]
        assert set(_thread_cpus(supervisor).values()) == {mine}
