"""Push targets in queue settings (issue 15): set, changed and cleared through AdminService on
one replica, followed by the pusher of another without a restart; refusals leave Redis as it was."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.protobuf import field_mask_pb2

from delayq.v1 import admin_pb2, admin_pb2_grpc, job_pb2
from tests.e2e.test_push import SECRET, _readme_verifier, put, state_is
from tests.support.digest import redis_digest
from tests.support.receiver import Hit, Receiver
from tests.support.rpc import Consumer, ms, query
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, wait_until

A = admin_pb2
SERVER_ARGS = ["--completed-retention", "60s", "--grace", "5s"]


def push_target(url: str, **kw: Any) -> admin_pb2.PushTarget:
    """A target for the test's receiver: http allowed, loopback allowlisted."""
    fields: dict[str, Any] = {
        "url": url,
        "allow_http": True,
        "allowlist": ["127.0.0.1/32"],
        "secret": SECRET,
        "timeout": ms(5000),
        **kw,
    }
    return A.PushTarget(**fields)


def mask(*paths: str) -> field_mask_pb2.FieldMask:
    return field_mask_pb2.FieldMask(paths=list(paths))


@pytest.fixture
def q(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]


def _lines(proc: DelayqProcess | list[str], text: str) -> int:
    out = proc.output if isinstance(proc, DelayqProcess) else proc
    return sum(text in line for line in out)


def _pushed(stub: Any, rx: Receiver, q: str, payload: bytes) -> Hit:
    job_id = put(stub, q, payload)
    wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
    (hit,) = [h for h in rx.hits if h.headers.get("Delayq-Job-Id") == job_id]
    return hit


def test_target_set_changed_and_cleared_through_one_replica_is_followed_by_another(
    redis_server: ManagedRedis, q: str
) -> None:
    verify = _readme_verifier()
    with (
        Receiver() as rx,
        DelayqProcess(redis_server.url, SERVER_ARGS) as admin_side,  # no pusher of its own
        DelayqProcess(redis_server.url, [*SERVER_ARGS, "--push"]) as pushing_side,
        admin_side.channel() as ch,
    ):
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        stub = admin_side.stub(ch)
        try:
            # Set: CreateQueue with a target; the other replica starts pushing.
            created = admin.CreateQueue(
                A.CreateQueueRequest(
                    queue=q,
                    settings=A.QueueSettings(push=push_target(rx.url, headers={"X-V": "1"})),
                ),
                timeout=10,
            ).queue
            assert created.settings.push.url == rx.url
            hit = _pushed(stub, rx, q, b"first")
            assert hit.headers["X-V"] == "1"
            assert verify(SECRET.encode(), hit.headers["Delayq-Signature"], hit.body)

            # GetQueue and ListQueues never return the secret.
            got = admin.GetQueue(A.GetQueueRequest(queue=q), timeout=10).queue.settings.push
            assert got.secret == "" and got.has_secret
            assert got.secret_fingerprint == hashlib.sha256(SECRET.encode()).hexdigest()[:12]
            assert got.headers == {"X-V": "1"} and got.allow_http and got.concurrency == 8
            listed = admin.ListQueues(A.ListQueuesRequest(), timeout=10).queues
            (mine,) = [x for x in listed if x.queue == q]
            assert mine.settings.push.secret == "" and mine.settings.push.has_secret
            assert SECRET.encode() not in A.ListQueuesResponse(queues=listed).SerializeToString()

            # Change: a new header, no secret given (the stored one is kept).
            started = _lines(pushing_side, f"pushing default/{q} to")
            changed = push_target(rx.url, headers={"X-V": "2"}, secret="")
            admin.UpdateQueue(
                A.UpdateQueueRequest(
                    queue=q, settings=A.QueueSettings(push=changed), update_mask=mask("push")
                ),
                timeout=10,
            )
            wait_until(lambda: _lines(pushing_side, f"pushing default/{q} to") > started, 30)
            hit = _pushed(stub, rx, q, b"second")
            assert hit.headers["X-V"] == "2"
            assert verify(SECRET.encode(), hit.headers["Delayq-Signature"], hit.body)

            # Clear: the mask names push, the settings leave it unset.
            admin.UpdateQueue(A.UpdateQueueRequest(queue=q, update_mask=mask("push")), timeout=10)
            wait_until(lambda: _lines(pushing_side, f"push default/{q}: target changed") >= 2, 30)
            assert not admin.GetQueue(A.GetQueueRequest(queue=q)).queue.settings.HasField("push")
            hits_before = len(rx.hits)
            ids = {put(stub, q, b"stays") for _ in range(3)}
            with Consumer(stub, [q]) as c:
                got_ids = {d.job.id for d in c.take(3, timeout=30)}
            assert got_ids == ids
            assert len(rx.hits) == hits_before  # nothing pushed once cleared
        except BaseException:
            sys.stderr.write("".join(pushing_side.output[-50:]))
            raise


def test_delayq_pusher_without_a_file_follows_queue_settings(
    redis_server: ManagedRedis, q: str
) -> None:
    with (
        Receiver() as rx,
        DelayqProcess(redis_server.url, SERVER_ARGS) as server,
        server.channel() as ch,
    ):
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        stub = server.stub(ch)
        pusher = subprocess.Popen(
            [sys.executable, "-m", "delayq_server.push", "--redis-url", redis_server.url,
             "--completed-retention", "60s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        )  # fmt: skip
        try:
            assert pusher.stdout is not None
            for _ in range(1000):  # other tests' queues may log their timers first
                line = pusher.stdout.readline()
                if not line or "delayq-pusher: pushing" in line:
                    break
            assert "delayq-pusher: pushing" in line
            admin.CreateQueue(A.CreateQueueRequest(queue=q), timeout=10)
            admin.UpdateQueue(
                A.UpdateQueueRequest(
                    queue=q,
                    settings=A.QueueSettings(push=push_target(rx.url)),
                    update_mask=mask("push"),
                ),
                timeout=10,
            )
            job_id = put(stub, q, b"via the pusher")
            wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
            assert [h.headers["Delayq-Job-Id"] for h in rx.hits] == [job_id]
            assert query(stub, q, job_id).attempts == 1
        finally:
            pusher.terminate()
            pusher.communicate(timeout=30)


@pytest.fixture(scope="module")
def isolated(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[admin_pb2_grpc.AdminServiceStub, redis.Redis]]:
    """A server on a Redis of its own with a queue "known" pushing to a target."""
    with (
        ManagedRedis(Path(tmp_path_factory.mktemp("push-refusals")), appendonly=False) as r,
        DelayqProcess(r.url) as server,
        server.channel() as ch,
    ):
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        admin.CreateQueue(
            A.CreateQueueRequest(
                queue="known", settings=A.QueueSettings(push=push_target("https://example.com/h"))
            )
        )
        yield admin, redis.Redis.from_url(r.url)


OK = "https://example.com/hook"
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("ftp scheme", {"url": "ftp://example.com/x", "allow_http": False}, "settings.push.url"),
    ("http unless allowed", {"url": "http://example.com/x", "allow_http": False},
     "settings.push.url"),
    ("no url", {"url": ""}, "settings.push.url"),
    ("credentials in url", {"url": "https://u:p@example.com/"}, "settings.push.url"),
    ("method", {"url": OK, "method": "GET"}, "settings.push.method"),
    ("reserved header", {"url": OK, "headers": {"Delayq-Signature": "x"}},
     "settings.push.headers"),
    ("timeout", {"url": OK, "timeout": ms(10)}, "settings.push.timeout"),
    ("concurrency", {"url": OK, "concurrency": 5000}, "settings.push.concurrency"),
    ("success", {"url": OK, "success": "3xx"}, "settings.push.success"),
    ("allowlist", {"url": OK, "allowlist": ["not a host"]}, "settings.push.allowlist[0]"),
    ("short secret", {"url": OK, "secret": "short"}, "settings.push.secret"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "fields", "field"), REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_targets_are_refused_naming_the_field_and_redis_untouched(
    isolated: tuple[admin_pb2_grpc.AdminServiceStub, redis.Redis],
    what: str,
    fields: dict[str, Any],
    field: str,
) -> None:
    admin, r = isolated
    target = push_target(**fields)
    before = redis_digest(r)
    for call in (
        lambda: admin.UpdateQueue(
            A.UpdateQueueRequest(
                queue="known", settings=A.QueueSettings(push=target), update_mask=mask("push")
            )
        ),
        lambda: admin.CreateQueue(
            A.CreateQueueRequest(queue="fresh", settings=A.QueueSettings(push=target))
        ),
    ):
        with pytest.raises(grpc.RpcError) as exc:
            call()
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
        assert field in (exc.value.details() or ""), (what, exc.value.details())
    assert redis_digest(r) == before


def test_a_target_without_a_secret_is_refused_on_a_queue_without_one(
    isolated: tuple[admin_pb2_grpc.AdminServiceStub, redis.Redis],
) -> None:
    admin, r = isolated
    before = redis_digest(r)
    with pytest.raises(grpc.RpcError) as exc:
        admin.CreateQueue(
            A.CreateQueueRequest(
                queue="fresh", settings=A.QueueSettings(push=push_target(OK, secret=""))
            )
        )
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "settings.push.secret" in (exc.value.details() or "")
    assert redis_digest(r) == before


def _exists(admin: admin_pb2_grpc.AdminServiceStub, q: str) -> bool:
    try:
        admin.GetQueue(A.GetQueueRequest(queue=q), timeout=10)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return False
    return True


def test_the_config_file_wins_for_the_queues_it_names(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    with Receiver() as from_file, Receiver() as from_settings:
        path = tmp_path / "push.json"
        file_target = {"queue": q, "url": from_file.url, "allow_http": True,
                       "allowlist": ["127.0.0.1/32"], "secret": SECRET}  # fmt: skip
        path.write_text(json.dumps({"targets": [file_target]}))
        with (
            DelayqProcess(redis_server.url, [*SERVER_ARGS, "--push-config", str(path)]) as proc,
            proc.channel() as ch,
        ):
            admin = admin_pb2_grpc.AdminServiceStub(ch)
            stub = proc.stub(ch)
            wait_until(lambda: _exists(admin, q), 30)  # the file's pusher creates it
            admin.UpdateQueue(
                A.UpdateQueueRequest(
                    queue=q,
                    settings=A.QueueSettings(push=push_target(from_settings.url)),
                    update_mask=mask("push"),
                ),
                timeout=10,
            )
            wait_until(lambda: _lines(proc, "the push config file names this queue") >= 1, 30)
            job_id = put(stub, q, b"file wins")
            wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
            assert len(from_file.hits) == 1 and not from_settings.hits
            # Later tests on this Redis start pushers without the file.
            admin.UpdateQueue(A.UpdateQueueRequest(queue=q, update_mask=mask("push")))
