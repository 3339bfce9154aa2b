"""Token lifecycle: admin RPCs, hashes only in Redis, expiry, revocation on every replica,
bootstrap, the CLI and the Python client's `token=`."""

from __future__ import annotations

import itertools
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
import redis
from google.protobuf import duration_pb2

from delayq import Client
from delayq.admin import AdminClient
from delayq.errors import PermissionDeniedError, UnauthenticatedError
from delayq.v1 import admin_pb2, service_pb2, service_pb2_grpc
from delayq_server.auth import tokens as server_tokens
from tests.support.auth import ROLE, AuthServer, auth_server
from tests.support.servers import ROOT, DelayqProcess, wait_until

_ns = itertools.count()


@pytest.fixture
def ns() -> str:
    return f"tok{next(_ns)}-{os.getpid()}"


def _enqueue_code(
    auth_srv: AuthServer, token: str, ns: str, address: str | None = None
) -> grpc.StatusCode:
    ch = grpc.insecure_channel(address or auth_srv.address)
    try:
        service_pb2_grpc.DelayQueueServiceStub(ch).Enqueue(
            service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x"),
            timeout=10,
            metadata=(("authorization", f"Bearer {token}"),),
        )
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return,unused-ignore]
    finally:
        ch.close()


def test_only_a_hash_of_the_token_is_stored(auth_srv: AuthServer, ns: str) -> None:
    token = auth_srv.token(ns, "produce", description="hash check")
    secret = token.split("_", 2)[2]  # the secret itself may contain "_"
    assert len(secret) == 43
    r = redis.Redis.from_url(auth_srv.redis.url)
    for key in r.scan_iter(match="dq:{auth}*"):
        dump = r.dump(key) or b""
        assert secret.encode() not in dump and token.encode() not in dump
    token_id = server_tokens.token_id_of(token)
    assert token_id is not None
    assert r.hget(f"dq:{{auth}}:tok:{token_id}", "hash") == server_tokens.digest(token).encode()
    r.close()


def test_tokens_are_random_and_unrelated() -> None:
    made = [server_tokens.generate() for _ in range(50)]
    assert len({t for t, _ in made}) == 50 and len({i for _, i in made}) == 50
    a, b = made[0][0], made[1][0]
    assert a[-20:] != b[-20:] and a[3:19] != b[3:19]


def test_create_list_revoke_and_namespace_admin_scope(auth_srv: AuthServer, ns: str) -> None:
    root = auth_srv.admin()
    made = root.CreateToken(
        admin_pb2.CreateTokenRequest(
            namespace=ns, roles=[ROLE["admin"], ROLE["read"]], description="ns admin"
        ),
        timeout=10,
    )
    assert made.info.namespace == ns and made.token.startswith("dq_")
    ns_admin = auth_srv.admin(made.token)
    # A namespace admin mints tokens for its namespace only.
    mine = ns_admin.CreateToken(
        admin_pb2.CreateTokenRequest(namespace=ns, roles=[ROLE["produce"]]), timeout=10
    )
    for target in ("*", ns + "-other"):
        with pytest.raises(grpc.RpcError) as info:
            ns_admin.CreateToken(
                admin_pb2.CreateTokenRequest(namespace=target, roles=[ROLE["produce"]]),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    other = root.CreateToken(
        admin_pb2.CreateTokenRequest(namespace=ns + "-other", roles=[ROLE["read"]]), timeout=10
    )
    listed = {
        t.token_id for t in ns_admin.ListTokens(admin_pb2.ListTokensRequest(), timeout=10).tokens
    }
    assert listed == {made.info.token_id, mine.info.token_id}
    everything = {
        t.token_id for t in root.ListTokens(admin_pb2.ListTokensRequest(), timeout=10).tokens
    }
    assert {made.info.token_id, mine.info.token_id, other.info.token_id} <= everything
    # Another namespace's token answers as a missing one.
    with pytest.raises(grpc.RpcError) as info:
        ns_admin.RevokeToken(admin_pb2.RevokeTokenRequest(token_id=other.info.token_id), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    ns_admin.RevokeToken(admin_pb2.RevokeTokenRequest(token_id=mine.info.token_id), timeout=10)
    assert _enqueue_code(auth_srv, mine.token, ns) == grpc.StatusCode.UNAUTHENTICATED
    # Bad input names the field.
    for bad in (
        admin_pb2.CreateTokenRequest(namespace=ns, roles=[]),
        admin_pb2.CreateTokenRequest(namespace="a:b", roles=[ROLE["read"]]),
        admin_pb2.CreateTokenRequest(namespace=ns, roles=[99]),  # type: ignore[list-item]
        admin_pb2.CreateTokenRequest(
            namespace=ns, roles=[ROLE["read"]], ttl=duration_pb2.Duration(seconds=-1)
        ),
    ):
        with pytest.raises(grpc.RpcError) as info:
            root.CreateToken(bad, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Non-admin tokens cannot manage tokens at all.
    reader = auth_srv.admin(auth_srv.token(ns, "read", "produce", "consume"))
    with pytest.raises(grpc.RpcError) as info:
        reader.ListTokens(admin_pb2.ListTokensRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_expired_token_is_refused(auth_srv: AuthServer, ns: str) -> None:
    token = auth_srv.token(ns, "produce", ttl=duration_pb2.Duration(seconds=1))
    assert _enqueue_code(auth_srv, token, ns) == grpc.StatusCode.OK
    wait_until(
        lambda: _enqueue_code(auth_srv, token, ns) == grpc.StatusCode.UNAUTHENTICATED,
        timeout=15,
        interval=0.1,
    )


def test_revocation_reaches_another_replica(auth_srv: AuthServer, ns: str) -> None:
    """The second replica has the token cached; it must refuse it within its cache TTL."""
    assert server_tokens.CACHE_TTL_S <= 1.0
    token = auth_srv.token(ns, "produce")
    with DelayqProcess(auth_srv.redis.url, ["--auth"]) as replica:
        assert _enqueue_code(auth_srv, token, ns, replica.address) == grpc.StatusCode.OK
        token_id = server_tokens.token_id_of(token)
        assert token_id is not None
        auth_srv.admin().RevokeToken(admin_pb2.RevokeTokenRequest(token_id=token_id), timeout=10)
        revoked_at = time.monotonic()
        wait_until(
            lambda: (
                _enqueue_code(auth_srv, token, ns, replica.address)
                == grpc.StatusCode.UNAUTHENTICATED
            ),
            timeout=15,
            interval=0.05,
        )
        print(f"revocation seen by the other replica after {time.monotonic() - revoked_at:.2f}s")


def test_bootstrap_file_is_written_private_and_reused(tmp_path: Path) -> None:
    with auth_server(tmp_path) as srv:
        mode = stat.S_IMODE(srv.token_file.stat().st_mode)
        assert mode == 0o600
        first = srv.admin_token
        assert srv.admin().ListTokens(admin_pb2.ListTokensRequest(), timeout=10).tokens
        assert srv.proc is not None
        srv.proc.terminate(15)
        srv.proc.start()
        assert srv.token_file.read_text().strip() == first
        assert srv.admin().ListTokens(admin_pb2.ListTokensRequest(), timeout=10).tokens


def test_first_start_without_a_file_prints_one_admin_token_once(
    redis_server: object, redis_url: str
) -> None:
    with DelayqProcess(redis_url, ["--auth"]) as first:
        wait_until(lambda: any("admin token (shown once)" in line for line in first.output))
        line = next(x for x in first.output if "admin token (shown once)" in x)
        token = line.rsplit(" ", 1)[1].strip()
        with AdminClient(first.address, token=token) as admin:
            assert [t.namespace for t in admin.list_tokens()] == ["*"]
    with DelayqProcess(redis_url, ["--auth"]) as second:
        assert not any("admin token" in line for line in second.output)


def test_auth_off_logs_a_warning_naming_the_bound_address(redis_url: str) -> None:
    with DelayqProcess(redis_url) as proc:  # started on port 0: the kernel picks one
        wait_until(lambda: any("auth is OFF" in line for line in proc.output))
        line = next(x for x in proc.output if "auth is OFF" in x)
        assert f"any client that reaches {proc.address} may use" in line, line


def test_python_client_token_and_env(
    auth_srv: AuthServer, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = auth_srv.token(ns, "produce", "read")
    with Client(auth_srv.address, namespace=ns, token=token) as c:
        job = c.enqueue("q", {"a": 1})
        assert c.get("q", job.job_id).id == job.job_id
    with Client(auth_srv.address, namespace=ns) as anon, pytest.raises(UnauthenticatedError):
        anon.enqueue("q", 1)
    monkeypatch.setenv("DELAYQ_TOKEN", token)
    with Client(auth_srv.address, namespace=ns) as c:
        assert c.enqueue("q", 2).job_id
    with Client(auth_srv.address, namespace=ns + "-x") as c, pytest.raises(PermissionDeniedError):
        c.enqueue("q", 3)


def _cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ}
    env.pop("DELAYQ_TOKEN", None)
    if token:
        env["DELAYQ_TOKEN"] = token
    return subprocess.run(
        [sys.executable, "-m", "delayq.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )


def test_cli_tokens_create_list_revoke(auth_srv: AuthServer, ns: str) -> None:
    t = ["-t", auth_srv.address]
    made = _cli(*t, "--token", auth_srv.admin_token, "tokens", "create", ns, "-r", "produce",
                "-r", "read", "--ttl", "1h", "--description", "cli", "--json")  # fmt: skip
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    assert info["namespace"] == ns and info["roles"] == ["produce", "read"]
    token = info["token"]
    enq = _cli(*t, "-n", ns, "enqueue", "q", "hello", token=token)
    assert enq.returncode == 0, enq.stderr
    listed = _cli(*t, "tokens", "list", ns, token=auth_srv.admin_token)
    assert listed.returncode == 0 and info["token_id"] in listed.stdout
    assert token not in listed.stdout
    revoked = _cli(*t, "tokens", "revoke", info["token_id"], token=auth_srv.admin_token)
    assert revoked.returncode == 0, revoked.stderr
    refused = _cli(*t, "-n", ns, "enqueue", "q", "again", token=token)
    assert refused.returncode == grpc.StatusCode.UNAUTHENTICATED.value[0], refused.stderr
    anon = _cli(*t, "tokens", "list")
    assert anon.returncode == grpc.StatusCode.UNAUTHENTICATED.value[0]
