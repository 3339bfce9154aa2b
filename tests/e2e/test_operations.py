"""Operating the real `python -m delayq_server` process: start-up refusals and settings."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, enqueue, query
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, free_port, wait_until


def run_server(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Runs a server that is expected to refuse to start."""
    return subprocess.run(
        [sys.executable, "-m", "delayq_server", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def assert_refused(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # one line, no traceback
    assert lines[0].startswith("delayq-server: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (["--default-lease", "500ms"], ["--default-lease", "1s to 12h"]),
        (["--default-lease", "13h"], ["--default-lease", "1s to 12h"]),
        (["--idempotency-window", "0"], ["--idempotency-window", "1s"]),
        (["--retry-jitter", "1.5"], ["--retry-jitter"]),
        (["--retry-multiplier", "0.5"], ["--retry-multiplier"]),
        (["--retry-initial", "10s", "--retry-max", "1s"], ["--retry-max"]),
        (["--bucket-width", "0"], ["--bucket-width"]),
        (["--default-max-attempts", "0"], ["--default-max-attempts"]),
        (["--max-payload-bytes", "0"], ["--max-payload-bytes"]),
        (["--shards-per-queue", "0"], ["--shards-per-queue"]),
        (["--log-level", "chatty"], ["--log-level"]),
        (["--grace", "soon"], ["--grace", "not a duration"]),
        (["--listen", "no-port"], ["--listen"]),
        (["--redis-url", "http://example.com"], ["--redis-url"]),
        (["--no-such-flag"], ["--no-such-flag"]),
    ],
)
def test_bad_settings_are_refused_in_one_line(args: list[str], fragments: list[str]) -> None:
    assert_refused(run_server("--listen", "127.0.0.1:0", *args), *fragments)


def test_bad_setting_from_the_environment_names_the_variable() -> None:
    env_run = subprocess.run(
        [sys.executable, "-m", "delayq_server", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "DELAYQ_DEFAULT_LEASE": "forever"},
    )
    assert_refused(env_run, "DELAYQ_DEFAULT_LEASE")


def test_unreachable_redis_is_one_line() -> None:
    port = free_port()  # nothing listens here
    proc = run_server("--redis-url", f"redis://127.0.0.1:{port}/0", "--listen", "127.0.0.1:0")
    assert_refused(proc, "cannot use Redis", str(port))


def test_unresolvable_listen_address_is_one_line(redis_url: str) -> None:
    proc = run_server("--redis-url", redis_url, "--listen", "no-such-host.invalid:5000")
    assert_refused(proc, "cannot listen on no-such-host.invalid:5000")


def test_second_server_on_the_same_port_refuses(redis_url: str) -> None:
    with DelayqProcess(redis_url) as first:
        proc = run_server("--redis-url", redis_url, "--listen", first.address)
        assert_refused(proc, f"cannot listen on {first.address}", "in use")
        with first.channel() as ch:  # the first one still serves alone
            enqueue(first.stub(ch), "still-mine")


def _start_managed(data_dir: Path) -> tuple[subprocess.Popen[str], list[str], int]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq_server",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            str(data_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "DELAYQ_REDIS_URL": ""},
    )
    lines: list[str] = []
    assert proc.stdout is not None
    redis_port = 0
    for line in proc.stdout:
        lines.append(line)
        if "started managed redis-server at redis://127.0.0.1:" in line:
            redis_port = int(line.split("redis://127.0.0.1:")[1].split("/")[0])
        if line.startswith("delayq: listening on "):
            return proc, lines, redis_port
    raise AssertionError("managed server did not start:\n" + "".join(lines))


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")  # exited; only waiting to be reaped by init


def test_managed_data_directory_is_locked_and_redis_dies_with_its_server(
    tmp_path: Path,
) -> None:
    proc, _, redis_port = _start_managed(tmp_path)
    try:
        client = redis.Redis(port=redis_port)
        redis_pid = int(client.info("server")["process_id"])
        client.close()
        second = run_server("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path))
        assert_refused(second, "is in use", str(tmp_path))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        wait_until(lambda: _gone(redis_pid), timeout=30, interval=0.05)  # no orphan
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
    # The lock went with the dead server: the directory can be used again.
    again, _, _ = _start_managed(tmp_path)
    again.send_signal(signal.SIGTERM)
    assert again.wait(60) == 0
    assert again.stdout is not None
    again.stdout.close()


def test_retry_jitter_shortens_backoffs(redis_url: str) -> None:
    args = ["--retry-initial", "1000s", "--retry-jitter", "0.5"]
    with DelayqProcess(redis_url, args) as server, server.channel() as ch:
        stub = server.stub(ch)
        waits = []
        ids = [enqueue(stub, "jit") for _ in range(8)]
        with Consumer(stub, ["jit"], max_outstanding=8) as c:
            for d in c.take(8, timeout=30):
                before = time.time()
                resp = stub.Nack(service_pb2.NackRequest(lease_token=d.lease_token), timeout=10)
                assert resp.state == job_pb2.JOB_STATE_SCHEDULED
                waits.append(resp.due_time.ToMilliseconds() / 1000 - before)
        assert query(stub, "jit", ids[0]).retry.jitter == pytest.approx(0.5)
    # Every wait is within [500 s, 1000 s] and they are not all the full 1000 s.
    assert all(499 <= w <= 1001 for w in waits), waits
    assert min(waits) < 990, waits
    assert len({round(w) for w in waits}) > 1, waits


def test_managed_redis_refuses_a_locked_directory_in_process(tmp_path: Path) -> None:
    with (
        ManagedRedis(tmp_path, appendonly=False),
        pytest.raises(RuntimeError, match="is in use"),
    ):
        ManagedRedis(tmp_path, appendonly=False).start()
