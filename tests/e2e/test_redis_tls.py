"""The server's Redis connection over TLS (`rediss://`), against a TLS-only redis-server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import trustme

from delayq.v1 import job_pb2, service_pb2
from tests.support.rpc import Consumer, ack, enqueue, query
from tests.support.servers import ROOT, DelayqProcess, free_port

PASSWORD = "tls-secret-pw-4711"  # must never show up in a start-up error


@dataclass
class TlsRedis:
    port: int
    ca_file: Path

    def url(self, scheme: str = "rediss", ca: bool = True) -> str:
        query = f"?ssl_ca_certs={self.ca_file}" if ca else ""
        return f"{scheme}://:{PASSWORD}@127.0.0.1:{self.port}/0{query}"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """A redis-server that listens on a TLS port only (`--port 0`), with a password."""
    d = tmp_path_factory.mktemp("redis-tls")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "server.key"))
    cert.cert_chain_pems[0].write_to_path(str(d / "server.pem"))
    port = free_port()
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server not installed"
    with open(d / "redis.log", "wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                "--port", "0",
                "--tls-port", str(port),
                "--bind", "127.0.0.1",
                "--tls-cert-file", str(d / "server.pem"),
                "--tls-key-file", str(d / "server.key"),
                "--tls-ca-cert-file", str(d / "ca.pem"),
                "--tls-auth-clients", "no",
                "--requirepass", PASSWORD,
                "--dir", str(d),
                "--save", "",
                "--appendonly", "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        client = redis.Redis(port=port, password=PASSWORD, ssl=True, ssl_ca_certs=str(d / "ca.pem"))
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (d / "redis.log").read_text()
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        client.close()
        yield TlsRedis(port, d / "ca.pem")
    finally:
        proc.terminate()
        proc.wait(10)


def run_server(redis_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "delayq_server",
            "--redis-url",
            redis_url,
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_enqueue_consume_ack_over_rediss(tls_redis: TlsRedis) -> None:
    server = DelayqProcess(tls_redis.url(), ["--completed-retention", "60s"])
    with server, server.channel() as ch:
        stub = server.stub(ch)
        job_id = enqueue(stub, "tls-q", b"over tls")
        with Consumer(stub, ["tls-q"]) as c:
            (d,) = c.take(1, timeout=30)
            assert d.job.id == job_id and d.job.payload == b"over tls"
            assert ack(stub, d.lease_token) == [service_pb2.ACK_RESULT_ACKED]
        assert query(stub, "tls-q", job_id).state == job_pb2.JOB_STATE_COMPLETED


@pytest.mark.parametrize(
    ("scheme", "ca", "reason"),
    [
        ("redis", False, "plaintext to the TLS port"),
        ("rediss", False, "the server's certificate is not trusted without the CA"),
    ],
)
def test_wrong_connection_is_refused_in_one_line(
    tls_redis: TlsRedis, scheme: str, ca: bool, reason: str
) -> None:
    out = run_server(tls_redis.url(scheme, ca))
    assert out.returncode == 2, (reason, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # one line, no traceback
    assert lines[0].startswith("delayq-server: error: cannot use Redis at "), out.stderr
    assert str(tls_redis.port) in lines[0]
    assert PASSWORD not in out.stderr + out.stdout


def test_tls_parameters_on_a_plaintext_url_are_refused_in_one_line(tls_redis: TlsRedis) -> None:
    # redis-py would pass ssl_ca_certs to a plaintext connection and fail with a
    # TypeError traceback on the first command.
    out = run_server(tls_redis.url("redis", ca=True))
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("delayq-server: error: --redis-url: "), out.stderr
    assert "ssl_ca_certs" in lines[0] and "rediss://" in lines[0]
    assert PASSWORD not in out.stderr + out.stdout
