"""The dashboard's JSON API (issue 14): reads, the CSRF guard, token checks, refusals."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq.v1 import service_pb2
from tests.support.auth import AuthServer, auth_server
from tests.support.digest import redis_digest
from tests.support.rpc import Consumer
from tests.support.servers import DelayqProcess, ManagedRedis


def call(
    port: int, path: str, body: Any = None, *, token: str = "", ctype: str = "application/json"
) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if body is not None:
        req.data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        req.add_header("Content-Type", ctype)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DelayqProcess, redis.Redis]]:
    with (
        ManagedRedis(Path(tmp_path_factory.mktemp("api-redis")), appendonly=False) as r,
        DelayqProcess(r.url, ["--http-listen", "127.0.0.1:0"]) as proc,
        proc.channel() as ch,
    ):
        stub = proc.stub(ch)
        stub.Enqueue(service_pb2.EnqueueRequest(queue="q", payload=b"x" * 10_000))
        client = redis.Redis.from_url(r.url)
        yield proc, client
        client.close()


def test_reads_and_refusals(plain: tuple[DelayqProcess, redis.Redis]) -> None:
    proc, client = plain
    port = proc.http_port
    code, body = call(port, "/api/queues")
    assert code == 200 and [q["queue"] for q in body["queues"]] == ["q"]
    code, body = call(port, "/api/queues/default/q")
    assert code == 200 and body["stats"]["ready"] == "1" and "histogram" in body
    code, body = call(port, "/api/queues/default/q/jobs?state=ready")
    assert code == 200 and len(body["jobs"]) == 1
    job_id = body["jobs"][0]["id"]
    code, body = call(port, f"/api/queues/default/q/jobs/{job_id}")
    assert code == 200 and body["payload_size"] == 10_000
    assert [t["event"] for t in body["timeline"]] == ["created", "due"]

    before = redis_digest(client)
    for path, body_, want, field in [
        ("/api/queues/default/nope", None, 404, "queue"),
        ("/api/queues/default/q/jobs?state=bogus", None, 400, "state"),
        ("/api/queues/default/q/jobs?state=ready&page_token=x", None, 400, "page_token"),
        ("/api/queues/default/q/jobs/not-an-id", None, 400, "job_id"),
        ("/api/queues/default/nope/pause", {}, 404, "queue"),
        ("/api/queues/default/q/purge", {"state": "NOPE"}, 400, "body"),
        ("/api/queues/default/q/purge", {"limit": 10_001}, 400, "limit"),
        ("/api/queues/default/q/redrive", {"target_queue": "nope"}, 404, "target_queue"),
    ]:
        code, out = call(port, path, body_)
        assert code == want, (path, out)
        assert out["message"].startswith(field + ":"), (path, out)
    # An action without a JSON body type: what a cross-site form would send.
    code, out = call(port, "/api/queues/default/q/pause", b"x=1", ctype="text/plain")
    assert code == 400 and out["message"].startswith("Content-Type:")
    assert redis_digest(client) == before


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthServer]:
    with auth_server(tmp_path_factory.mktemp("api-auth"), ["--http-listen", "127.0.0.1:0"]) as srv:
        yield srv


def test_actions_need_an_admin_token_of_the_namespace(secured: AuthServer) -> None:
    assert secured.proc is not None
    port = secured.proc.http_port
    producer = secured.token("apins", "produce")
    secured.stub(producer).Enqueue(
        service_pb2.EnqueueRequest(namespace="apins", queue="q", payload=b"x")
    )
    client = redis.Redis.from_url(secured.redis.url)
    reader = secured.token("apins", "read")
    stranger = secured.token("other", "admin")
    admin = secured.token("apins", "admin")
    try:
        code, body = call(port, "/api/queues/apins/q")  # reads need no token
        assert code == 200 and body["stats"]["ready"] == "1"
        before = redis_digest(client)
        for token, want in [("", 401), ("dq_bad", 401), (reader, 403), (stranger, 403)]:
            code, out = call(port, "/api/queues/apins/q/pause", {}, token=token)
            assert code == want, (token, out)
        assert redis_digest(client) == before
        code, session = call(port, "/api/session", token=reader)
        assert code == 200 and session == {
            "auth": True, "admin": False, "namespace": "apins", "name": session["name"]
        }  # fmt: skip
        code, body = call(port, "/api/queues/apins/q/pause", {}, token=admin)
        assert code == 200 and body["queue"]["paused"] is True
    finally:
        client.close()


def test_queues_carry_this_servers_lateness_p99(plain: tuple[DelayqProcess, redis.Redis]) -> None:
    """No deliveries yet: null; after a Consume delivered jobs: their p99 (ms), on the
    list and on the queue (lateness.py)."""
    proc, _ = plain
    port = proc.http_port
    _, body = call(port, "/api/queues")
    assert {q["queue"]: q["lateness_p99_ms"] for q in body["queues"]}["q"] is None
    with proc.channel() as ch:
        stub = proc.stub(ch)
        for _ in range(3):
            stub.Enqueue(service_pb2.EnqueueRequest(queue="late", payload=b"x"))
        with Consumer(stub, ["late"]) as c:
            c.take(3)
    _, body = call(port, "/api/queues")
    p99 = {q["queue"]: q["lateness_p99_ms"] for q in body["queues"]}["late"]
    assert isinstance(p99, float) and 0 <= p99 < 60_000
    _, one = call(port, "/api/queues/default/late")
    assert one["lateness_p99_ms"] == p99


@pytest.mark.parametrize("path", ["/", "/dashboard"])
def test_the_page_is_reached_without_its_trailing_slash(
    plain: tuple[DelayqProcess, redis.Redis], path: str
) -> None:
    # A user types the address without the slash; aiohttp's routes match exactly.
    proc, _ = plain
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.http_port}{path}", timeout=20) as resp:
        assert resp.status == 200 and resp.url.endswith("/dashboard/")
        assert b"<html" in resp.read().lower()
