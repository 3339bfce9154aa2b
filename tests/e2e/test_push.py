"""Push delivery end to end: the real server POSTs due jobs to a real local HTTP receiver."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web

from delayq.v1 import job_pb2, service_pb2
from tests.support.receiver import Hit, Receiver
from tests.support.rpc import Stub, ms, query
from tests.support.servers import ROOT, DelayqProcess, ManagedRedis, wait_until

SECRET = "test-secret-0123456789abcdef"
SERVER_ARGS = ["--completed-retention", "60s", "--grace", "5s"]
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _readme_verifier() -> Callable[[bytes, str, bytes], bool]:
    """The signature check exactly as README "Push delivery" documents it."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    (snippet,) = [b for b in blocks if "def verify_delayq_signature" in b]
    scope: dict[str, Any] = {}
    exec(snippet, scope)
    return scope["verify_delayq_signature"]  # type: ignore[no-any-return]


def target(queue: str, url: str, **kw: Any) -> dict[str, Any]:
    """A target for the test's receiver: http allowed, loopback allowlisted, unless overridden."""
    return {
        "queue": queue,
        "url": url,
        "allow_http": True,
        "allowlist": ["127.0.0.1/32"],
        "secret": SECRET,
        "timeout": "5s",
        **kw,
    }


@contextmanager
def pushing(
    redis: ManagedRedis, tmp_path: Path, targets: list[dict[str, Any]], **top: Any
) -> Iterator[tuple[DelayqProcess, Stub]]:
    path = tmp_path / "push.json"
    path.write_text(json.dumps({"targets": targets, **top}))
    with (
        DelayqProcess(redis.url, [*SERVER_ARGS, "--push-config", str(path)]) as proc,
        grpc.insecure_channel(proc.address) as ch,
    ):
        try:
            yield proc, proc.stub(ch)
        except BaseException:
            sys.stderr.write("".join(proc.output[-50:]))  # the server's side of a failure
            raise


def put(stub: Stub, queue: str, payload: bytes = b"job", **kw: Any) -> str:
    metadata = kw.pop("metadata", None)
    req = service_pb2.EnqueueRequest(queue=queue, payload=payload, **kw)
    return stub.Enqueue(req, timeout=10, metadata=metadata).job_id


def fast_retry() -> job_pb2.RetryPolicy:
    return job_pb2.RetryPolicy(initial_backoff=ms(50), max_backoff=ms(100), jitter=0.0)


def state_is(stub: Stub, queue: str, job_id: str, state: int) -> Callable[[], bool]:
    return lambda: query(stub, queue, job_id).state == state


def answers(*responses: Callable[[], web.StreamResponse]) -> Callable[[Hit], Any]:
    """The n-th request gets the n-th response (the last one repeats)."""

    async def behave(hit: Hit) -> web.StreamResponse:
        return responses[min(hit.n, len(responses)) - 1]()

    return behave


@pytest.fixture
def q(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]


def test_push_acks_on_2xx_with_the_documented_body_and_headers(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    with (
        Receiver() as rx,
        pushing(redis_server, tmp_path, [target(q, rx.url, headers={"X-Team": "red"})]) as (
            _,
            stub,
        ),
    ):
        job_id = put(
            stub, q, b'{"hello": "w\xc3\xb6rld"}', headers={"k": "v"},
            metadata=(("traceparent", TRACEPARENT),),
        )  # fmt: skip
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
        (hit,) = rx.hits
        doc = json.loads(hit.body)
        assert doc["id"] == job_id and doc["queue"] == q and doc["namespace"] == "default"
        assert doc["attempt"] == 1 and doc["payload_encoding"] == "utf-8"
        assert doc["payload"] == '{"hello": "wörld"}'
        assert doc["headers"]["k"] == "v"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", doc["due_time"])
        assert hit.method == "POST" and hit.path == "/hook"
        assert hit.headers["Content-Type"] == "application/json"
        assert hit.headers["X-Team"] == "red"
        assert hit.headers["Delayq-Job-Id"] == job_id and hit.headers["Delayq-Attempt"] == "1"
        assert hit.headers["traceparent"] == TRACEPARENT  # the producer's trace
        assert query(stub, q, job_id).attempts == 1


def test_signature_verifies_with_the_readme_snippet(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    verify = _readme_verifier()
    with Receiver() as rx, pushing(redis_server, tmp_path, [target(q, rx.url)]) as (_, stub):
        ids = [put(stub, q, b"text"), put(stub, q, b"\xff\x00binary")]
        for job_id in ids:
            wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
    assert len(rx.hits) == 2
    for hit in rx.hits:
        sig = hit.headers["Delayq-Signature"]
        assert verify(SECRET.encode(), sig, hit.body)
        assert not verify(b"another-secret-0123456789", sig, hit.body)
        assert not verify(SECRET.encode(), sig, hit.body.replace(b"default", b"defauly"))
        t = int(sig.split(",")[0].removeprefix("t="))
        replayed = sig.replace(f"t={t}", f"t={t - 3600}")
        assert not verify(SECRET.encode(), replayed, hit.body)  # old timestamp: refused
    binary = next(json.loads(h.body) for h in rx.hits if b"base64" in h.body)
    assert base64.b64decode(binary["payload"]) == b"\xff\x00binary"


def test_a_500_then_success_retries_and_acks(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    behave = answers(lambda: web.Response(status=500, text="oops"), lambda: web.Response())
    with Receiver(behave) as rx, pushing(redis_server, tmp_path, [target(q, rx.url)]) as (_, stub):
        job_id = put(stub, q, retry=fast_retry())
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
        job = query(stub, q, job_id)
    assert job.attempts == 2 and len(rx.hits) == 2
    assert [json.loads(h.body)["attempt"] for h in rx.hits] == [1, 2]


def test_later_success_mode_wants_code_100(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    behave = answers(
        lambda: web.json_response({"code": 500, "msg": "busy"}),
        lambda: web.json_response({"code": 100}),
    )
    with (
        Receiver(behave) as rx,
        pushing(redis_server, tmp_path, [target(q, rx.url, success="later")]) as (_, stub),
    ):
        job_id = put(stub, q, retry=fast_retry())
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
        job = query(stub, q, job_id)
    assert job.attempts == 2 and len(rx.hits) == 2
    assert job.last_error.startswith('push: HTTP 200 without {"code":100}: {"code": 500')


def test_a_timeout_is_a_failure_with_its_reason(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    async def hang(_hit: Hit) -> web.StreamResponse:
        await asyncio.sleep(60)  # cancelled when the receiver stops
        return web.Response()

    with (
        Receiver(hang) as rx,
        # 2 s: the receiver (a thread of this process) records the hit before then.
        pushing(redis_server, tmp_path, [target(q, rx.url, timeout="2s")]) as (_, stub),
    ):
        job_id = put(stub, q, max_attempts=1)
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_DEAD), 30)
        job = query(stub, q, job_id)
    assert job.last_error == "push: timeout after 2s"
    assert len(rx.hits) == 1


def test_an_endless_response_body_is_cut_at_the_cap(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    """Read in full, this body would run into the timeout; capped, the answer is its status."""

    async def endless(hit: Hit) -> web.StreamResponse:
        resp = web.StreamResponse(status=500)
        resp.enable_chunked_encoding()
        await resp.prepare(hit.request)
        with suppress(ConnectionError):
            while True:
                await resp.write(b"y" * 65536)
        return resp

    with (
        Receiver(endless) as rx,
        pushing(
            redis_server, tmp_path, [target(q, rx.url, timeout="20s", max_response_bytes=1024)]
        ) as (_, stub),
    ):
        job_id = put(stub, q, max_attempts=1)
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_DEAD), 60)
        job = query(stub, q, job_id)
    assert job.last_error == "push: HTTP 500: " + "y" * 200


def _gate(limit: int) -> tuple[Receiver, Callable[[Hit], Any]]:
    """A slow receiver: each request is held until ``limit`` are in flight at once (or
    10 s), then half a second more, so a pusher that sends more than ``limit`` at a
    time shows above it (the hold is the receiver's slowness, not a test timing)."""
    full = asyncio.Event()
    rx = Receiver()

    async def behave(_hit: Hit) -> web.StreamResponse:
        if rx.in_flight >= limit:
            full.set()
        with suppress(TimeoutError):
            await asyncio.wait_for(full.wait(), 10)
        await asyncio.sleep(0.5)
        return web.Response()

    rx.behaviour = behave
    return rx, behave


def test_a_slow_receiver_sees_at_most_the_target_concurrency(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    rx, _ = _gate(3)
    with rx, pushing(redis_server, tmp_path, [target(q, rx.url, concurrency=3)]) as (_, stub):
        ids = [put(stub, q) for _ in range(12)]
        for job_id in ids:
            wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 60)
    assert len(rx.hits) == 12
    assert rx.max_in_flight == 3


def test_per_host_concurrency_bounds_targets_sharing_a_host(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    rx, _ = _gate(2)
    with rx:
        targets = [target(f"{q}-{s}", rx.url, concurrency=4) for s in "ab"]
        with pushing(redis_server, tmp_path, targets, per_host_concurrency=2) as (_, stub):
            ids = [(f"{q}-{s}", put(stub, f"{q}-{s}")) for s in "ab" for _ in range(5)]
            for queue, job_id in ids:
                wait_until(state_is(stub, queue, job_id, job_pb2.JOB_STATE_COMPLETED), 60)
    assert len(rx.hits) == 10
    assert rx.max_in_flight == 2


def test_retry_after_sets_the_retry_delay(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    behave = answers(
        lambda: web.Response(status=503, headers={"Retry-After": "2"}), lambda: web.Response()
    )
    with Receiver(behave) as rx, pushing(redis_server, tmp_path, [target(q, rx.url)]) as (_, stub):
        job_id = put(stub, q, retry=fast_retry())  # 50 ms backoff without Retry-After
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
    first, second = rx.hits
    assert second.at - first.at >= 1.9


def test_dead_letter_after_max_attempts_with_status_and_excerpt(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    behave = answers(lambda: web.Response(status=500, text="boom " + "x" * 500))
    with Receiver(behave) as rx, pushing(redis_server, tmp_path, [target(q, rx.url)]) as (_, stub):
        job_id = put(stub, q, max_attempts=3, retry=fast_retry())
        wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_DEAD), 30)
        job = query(stub, q, job_id)
        dead = stub.ListDeadJobs(service_pb2.ListDeadJobsRequest(queue=q), timeout=10).jobs
    assert job.attempts == 3 and len(rx.hits) == 3
    excerpt = ("boom " + "x" * 500)[:200]
    assert job.last_error == f"push: HTTP 500: {excerpt}"
    assert [d.id for d in dead] == [job_id]


# -- SSRF -------------------------------------------------------------------------


def test_loopback_target_is_refused_unless_allowlisted(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    with (
        Receiver() as rx,
        pushing(
            redis_server, tmp_path,
            [target(q, rx.url, allowlist=[]), target(f"{q}-ok", rx.url)],
        ) as (_, stub),
    ):  # fmt: skip
        refused = put(stub, q, max_attempts=1)
        allowed = put(stub, f"{q}-ok")
        wait_until(state_is(stub, q, refused, job_pb2.JOB_STATE_DEAD), 30)
        wait_until(state_is(stub, f"{q}-ok", allowed, job_pb2.JOB_STATE_COMPLETED), 30)
        job = query(stub, q, refused)
    assert "address 127.0.0.1 refused (loopback" in job.last_error
    assert [json.loads(h.body)["id"] for h in rx.hits] == [allowed]  # the refused one never came


def test_localhost_by_name_is_refused_and_can_be_allowlisted_by_name(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    with Receiver() as rx:
        url = f"http://localhost:{rx.port}/hook"
        targets = [target(q, url, allowlist=[]), target(f"{q}-ok", url, allowlist=["localhost"])]
        with pushing(redis_server, tmp_path, targets) as (_, stub):
            refused = put(stub, q, max_attempts=1)
            allowed = put(stub, f"{q}-ok")
            wait_until(state_is(stub, q, refused, job_pb2.JOB_STATE_DEAD), 30)
            wait_until(state_is(stub, f"{q}-ok", allowed, job_pb2.JOB_STATE_COMPLETED), 30)
            job = query(stub, q, refused)
    assert "refused (loopback" in job.last_error
    assert [json.loads(h.body)["id"] for h in rx.hits] == [allowed]


def test_a_redirect_to_a_private_address_is_not_followed(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    with Receiver() as inner:
        to_inner = answers(lambda: web.Response(status=302, headers={"Location": inner.url}))
        with (
            Receiver(to_inner) as outer,
            pushing(redis_server, tmp_path, [target(q, outer.url)]) as (_, stub),
        ):
            job_id = put(stub, q, max_attempts=2, retry=fast_retry())
            wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_DEAD), 30)
            job = query(stub, q, job_id)
    assert len(outer.hits) == 2  # nacked and retried, then dead
    assert inner.hits == []  # never followed
    assert job.last_error == f"push: HTTP 302 redirect to {inner.url} not followed"


# -- refusals at start ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"allow_http": False}, 'targets[0].url: https is required (set "allow_http": true'),
        ({"secret": "short"}, "targets[0]: the secret must be at least 16 bytes"),
        (
            {"headers": {"Delayq-Signature": "x"}},
            "targets[0].headers: 'Delayq-Signature' is set by the pusher",
        ),
        (
            {"allowlist": ["10.0.0.0/33"]},
            "targets[0].allowlist[0]: '10.0.0.0/33' is not a host name",
        ),
    ],
)
def test_a_bad_push_config_is_refused_at_start_in_one_line(
    redis_server: ManagedRedis, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = tmp_path / "push.json"
    path.write_text(json.dumps({"targets": [target("q", "http://example.com/", **change)]}))
    out = subprocess.run(
        [sys.executable, "-m", "delayq_server", "--redis-url", redis_server.url,
         "--listen", "127.0.0.1:0", "--push-config", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert out.stderr.startswith(f"delayq-server: error: --push-config: {message}")


# -- the separate process ----------------------------------------------------------


def test_delayq_pusher_process_pushes_without_the_server_doing_it(
    redis_server: ManagedRedis, tmp_path: Path, q: str
) -> None:
    path = tmp_path / "push.json"
    with Receiver() as rx:
        path.write_text(json.dumps({"targets": [target(q, rx.url)]}))
        with (
            DelayqProcess(redis_server.url, SERVER_ARGS) as server,  # no --push-config
            grpc.insecure_channel(server.address) as ch,
        ):
            stub = server.stub(ch)
            pusher = subprocess.Popen(
                [sys.executable, "-m", "delayq_server.push", "--redis-url", redis_server.url,
                 "--completed-retention", "60s", "--push-config", str(path)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
            )  # fmt: skip
            try:
                assert pusher.stdout is not None
                for line in pusher.stdout:  # log lines first, then this one
                    if line.startswith("delayq-pusher: pushing 1 queue"):
                        break
                job_id = put(stub, q)
                wait_until(state_is(stub, q, job_id, job_pb2.JOB_STATE_COMPLETED), 30)
            finally:
                pusher.terminate()
                pusher.wait(30)
                if pusher.stdout is not None:
                    pusher.stdout.close()
    assert [json.loads(h.body)["id"] for h in rx.hits] == [job_id]
    assert pusher.returncode == 0
