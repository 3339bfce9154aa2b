"""The admin HTTP port: off by default, on with --http-listen, refusals in one line."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

from tests.support.servers import DelayqProcess, ManagedRedis


def test_http_port_serves_healthz_when_enabled(redis_server: ManagedRedis) -> None:
    with DelayqProcess(redis_server.url, ["--http-listen", "127.0.0.1:0"]) as proc:
        assert proc.http_port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.http_port}/healthz") as resp:
            assert resp.status == 200
            assert resp.read() == b"ok\n"


def test_http_port_is_off_by_default(server: DelayqProcess) -> None:
    assert server.http_port == 0
    assert not any("admin http" in line for line in server.output)


def test_bad_http_listen_is_refused_in_one_line(redis_server: ManagedRedis) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "delayq_server", "--redis-url", redis_server.url,
         "--listen", "127.0.0.1:0", "--http-listen", "nonsense"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert "--http-listen: 'nonsense' is not host:port" in out.stderr
