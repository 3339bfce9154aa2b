"""Property tests: random and malformed requests to every RPC, as tenant A with auth on.

Checked after every example: only canonical statuses come back, the server is
up, and no Redis key outside tenant A's namespace changed (DUMP digests).
`make test` runs a small derandomized set; `make fuzz` sets DELAYQ_FUZZ_EXAMPLES.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.protobuf import duration_pb2, timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delayq.v1 import admin_pb2, service_pb2
from tests.support.auth import AuthServer, auth_server
from tests.support.rpc import ms

EXAMPLES = int(os.environ.get("DELAYQ_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=os.environ.get("DELAYQ_FUZZ_RANDOM", "") == "",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
A, B = "fuzz-a", "fuzz-b"
C = grpc.StatusCode
CANONICAL = {
    C.OK,
    C.INVALID_ARGUMENT,
    C.NOT_FOUND,
    C.FAILED_PRECONDITION,
    C.PERMISSION_DENIED,
    C.UNAUTHENTICATED,
    C.RESOURCE_EXHAUSTED,
}
STATS: dict[str, dict[str, int]] = {}


@dataclass
class World:
    srv: AuthServer
    a_token: str
    b_token: str
    b_job_ids: list[str]
    b_lease: str
    a_job_ids: list[str]
    redis: redis.Redis
    foreign_before: dict[bytes, str]
    b_stream: Any


def _own(key: bytes) -> bool:
    """Keys of tenant A, which its own calls may change."""
    return key.startswith((f"dq:{{{A}/".encode(), f"dq:{{ns:{A}}}".encode()))


_VOLATILE: set[bytes] = set()  # keys seen with a TTL


def _volatile(key: bytes) -> bool:
    return key in _VOLATILE


def foreign_digest(r: redis.Redis) -> dict[bytes, str]:
    """sha256 of DUMP for every key outside tenant A (A's members of dq:queues aside)."""
    out: dict[bytes, str] = {}
    for key in r.scan_iter(count=1000):
        if _own(key):
            continue
        if key.startswith(b"dq:{ns:") and key.endswith(b":streams"):
            # Open streams renew their slot's expiry in the background: members only.
            slots: list[bytes] = list(r.zrange(key, 0, -1))  # type: ignore[arg-type]
            out[key] = hashlib.sha256(b"\n".join(sorted(slots))).hexdigest()
            continue
        if key == b"dq:{auth}:tokens":
            continue  # an index: the token records themselves are compared
        if key.startswith(b"dq:{auth}:tok:") and r.hget(key, "ns") == A.encode():
            continue  # A's own tokens (A is an admin of its namespace)
        if key == b"dq:queues":
            queues: set[bytes] = r.smembers(key)  # type: ignore[assignment]
            members = sorted(m for m in queues if not m.startswith(f"{A}/".encode()))
            out[key] = hashlib.sha256(b"\n".join(members)).hexdigest()
            continue
        if r.pttl(key) > 0:
            _VOLATILE.add(key)
        dump = r.dump(key)
        if dump is None:  # expired between SCAN and DUMP (Redis expires lazily)
            continue
        out[key] = hashlib.sha256(dump).hexdigest()
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with auth_server(tmp_path_factory.mktemp("fuzz")) as srv:
        roles = ("produce", "consume", "read", "admin")
        a_token, b_token = srv.token(A, *roles), srv.token(B, *roles)
        b = srv.stub(b_token)
        a = srv.stub(a_token)
        b_ids = [
            b.Enqueue(
                service_pb2.EnqueueRequest(namespace=B, queue="q", payload=b"b"), timeout=10
            ).job_id
            for _ in range(3)
        ]
        b_ids.append(
            b.Enqueue(
                service_pb2.EnqueueRequest(
                    namespace=B, queue="later", payload=b"b", delay=ms(86_400_000)
                ),
                timeout=10,
            ).job_id
        )
        stream = b.Consume(
            service_pb2.ConsumeRequest(
                namespace=B, queues=["q"], max_outstanding=1, lease_duration=ms(3_600_000)
            )
        )
        lease = next(iter(stream)).deliveries[0].lease_token
        a_ids = [
            a.Enqueue(
                service_pb2.EnqueueRequest(namespace=A, queue="q", payload=b"a"), timeout=10
            ).job_id
            for _ in range(3)
        ]
        r = redis.Redis.from_url(srv.redis.url)
        w = World(srv, a_token, b_token, b_ids, lease, a_ids, r, foreign_digest(r), stream)
        yield w
        stream.cancel()  # type: ignore[no-untyped-call]
        r.close()
        path = os.environ.get("DELAYQ_FUZZ_REPORT")
        if path:
            Path(path).write_text(
                "\n".join(f"{m}: {dict(sorted(c.items()))}" for m, c in sorted(STATS.items()))
                + "\n"
            )


def _record(method: str, code: grpc.StatusCode) -> None:
    counts = STATS.setdefault(method, {})
    counts[code.name] = counts.get(code.name, 0) + 1


def check(w: World, method: str, call: Callable[[], Any], *, stream: bool = False) -> None:
    code, details = C.OK, ""
    try:
        result = call()
        if stream:
            next(iter(result))
    except StopIteration:
        pass
    except grpc.RpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if stream and code == C.DEADLINE_EXCEEDED:  # the stream was open and waiting
            code = C.OK
    _record(method, code)
    assert code in CANONICAL, f"{method}: {code} {details}"
    assert "Traceback" not in details and "redis://" not in details, details
    assert w.srv.proc is not None and w.srv.proc.proc is not None
    assert w.srv.proc.proc.poll() is None, "server died"
    after = foreign_digest(w.redis)
    changed = {
        k for k in set(after) | set(w.foreign_before) if after.get(k) != w.foreign_before.get(k)
    }
    # Keys with a TTL (rate buckets, replay entries of B's own calls) may expire
    # by themselves: only their disappearing is allowed, never a new value.
    changed = {
        k for k in changed if not (k not in after and w.redis.pttl(k) == -2 and _volatile(k))
    }
    assert not changed, f"{method} changed keys outside {A}: {sorted(changed)[:5]}"


# -- strategies ----------------------------------------------------------------------------

NASTY = ["", "{}", ":", "/", "{", "}", A, B, f"{B}/q/0", "a:b", "x" * 65, "ü", "\x00", "*", " "]
names = st.one_of(st.sampled_from(NASTY), st.text(max_size=70))
namespaces = st.one_of(st.just(A), st.just(""), names)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
durations = st.builds(
    duration_pb2.Duration,
    seconds=st.one_of(st.integers(-10, 100_000), int64.filter(lambda x: abs(x) <= 315_576_000_000)),
    nanos=st.integers(-999_999_999, 999_999_999),
)
timestamps = st.builds(
    timestamp_pb2.Timestamp,
    seconds=st.integers(-62_135_596_800, 253_402_300_799),
    nanos=st.integers(0, 999_999_999),
)
payloads = st.one_of(st.binary(max_size=64), st.just(b""), st.just(b"x" * 300_000))


def job_ids(w: World) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(w.b_job_ids + w.a_job_ids), names, st.text(max_size=40))


def lease_tokens(w: World) -> st.SearchStrategy[str]:
    forged = w.b_lease.replace(B, A, 1)
    return st.one_of(
        st.sampled_from([w.b_lease, forged, w.b_lease[:-1], w.b_lease + "0", "", "a/b/0/x/y"]),
        st.text(max_size=80),
    )


# -- properties ----------------------------------------------------------------------------


def enqueue_requests(w: World) -> st.SearchStrategy[service_pb2.EnqueueRequest]:
    return st.builds(
        service_pb2.EnqueueRequest,
        namespace=namespaces,
        queue=names,
        payload=payloads,
        headers=st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
        delay=st.one_of(st.none(), durations),
        ttl=st.one_of(st.none(), durations),
        max_attempts=st.integers(0, 2**32 - 1),
        idempotency_key=st.one_of(st.just(""), st.text(max_size=300)),
    )


@given(data=st.data())
@FUZZ
def test_fuzz_produce(world: World, data: st.DataObject) -> None:
    stub = world.srv.stub(world.a_token)
    req = data.draw(enqueue_requests(world))
    check(world, "Enqueue", lambda: stub.Enqueue(req, timeout=10))
    batch = service_pb2.EnqueueBatchRequest(
        requests=data.draw(st.lists(enqueue_requests(world), max_size=4))
    )
    check(world, "EnqueueBatch", lambda: stub.EnqueueBatch(batch, timeout=10))
    due = service_pb2.EnqueueRequest(
        namespace=A, queue="q", payload=b"x", due_time=data.draw(timestamps)
    )
    check(world, "Enqueue(due_time)", lambda: stub.Enqueue(due, timeout=10))


@given(data=st.data())
@FUZZ
def test_fuzz_consume_and_leases(world: World, data: st.DataObject) -> None:
    stub = world.srv.stub(data.draw(st.sampled_from([world.a_token, world.a_token, "dq_junk"])))
    consume = service_pb2.ConsumeRequest(
        namespace=data.draw(namespaces),
        queues=data.draw(st.lists(names, max_size=3)),
        max_outstanding=data.draw(st.integers(0, 20_000)),
        lease_duration=data.draw(durations),
        max_batch=data.draw(st.integers(0, 2_000)),
    )
    check(world, "Consume", lambda: stub.Consume(consume, timeout=0.5), stream=True)
    tokens = data.draw(st.lists(lease_tokens(world), max_size=5))
    check(world, "Ack", lambda: stub.Ack(service_pb2.AckRequest(lease_tokens=tokens), timeout=10))
    check(
        world,
        "Release",
        lambda: stub.Release(service_pb2.ReleaseRequest(lease_tokens=tokens), timeout=10),
    )
    nack = service_pb2.NackRequest(
        lease_token=data.draw(lease_tokens(world)),
        delay=data.draw(durations),
        reason=data.draw(st.text(max_size=50)),
    )
    check(world, "Nack", lambda: stub.Nack(nack, timeout=10))
    nack_dead = service_pb2.NackRequest(
        lease_token=data.draw(lease_tokens(world)), dead_letter=True
    )
    check(world, "Nack(dead)", lambda: stub.Nack(nack_dead, timeout=10))
    ext = service_pb2.ExtendLeaseRequest(
        lease_token=data.draw(lease_tokens(world)), extension=data.draw(durations)
    )
    check(world, "ExtendLease", lambda: stub.ExtendLease(ext, timeout=10))


@given(data=st.data())
@FUZZ
def test_fuzz_read_and_admin(world: World, data: st.DataObject) -> None:
    stub = world.srv.stub(world.a_token)
    ns, queue, job = data.draw(namespaces), data.draw(names), data.draw(job_ids(world))
    check(
        world,
        "Query",
        lambda: stub.Query(
            service_pb2.QueryRequest(namespace=ns, queue=queue, job_id=job), timeout=10
        ),
    )
    check(
        world,
        "GetQueueStats",
        lambda: stub.GetQueueStats(
            service_pb2.GetQueueStatsRequest(namespace=ns, queue=queue), timeout=10
        ),
    )
    page = service_pb2.ListDeadJobsRequest(
        namespace=ns,
        queue=queue,
        page_size=data.draw(st.integers(0, 2**32 - 1)),
        page_token=data.draw(
            st.one_of(
                st.just(""), st.text(max_size=20), st.sampled_from(["0:-5", "-1:0", "9:9", ":"])
            )
        ),
    )
    check(world, "ListDeadJobs", lambda: stub.ListDeadJobs(page, timeout=10))
    ids = data.draw(st.lists(job_ids(world), max_size=3))
    limit = data.draw(st.integers(0, 2**32 - 1))
    check(
        world,
        "RedriveDeadJobs",
        lambda: stub.RedriveDeadJobs(
            service_pb2.RedriveDeadJobsRequest(namespace=ns, queue=queue, job_ids=ids, limit=limit),
            timeout=10,
        ),
    )
    check(
        world,
        "PurgeDeadJobs",
        lambda: stub.PurgeDeadJobs(
            service_pb2.PurgeDeadJobsRequest(namespace=ns, queue=queue, job_ids=ids, limit=limit),
            timeout=10,
        ),
    )
    check(
        world,
        "Delete",
        lambda: stub.Delete(
            service_pb2.DeleteRequest(namespace=ns, queue=queue, job_id=job), timeout=10
        ),
    )
    admin = world.srv.admin(world.a_token)
    create = admin_pb2.CreateTokenRequest(
        namespace=data.draw(namespaces),
        roles=data.draw(st.lists(st.integers(-1, 6), max_size=4)),  # type: ignore[arg-type]
        ttl=data.draw(durations),
        description=data.draw(st.text(max_size=300)),
    )
    check(world, "CreateToken", lambda: admin.CreateToken(create, timeout=10))
    check(
        world,
        "ListTokens",
        lambda: admin.ListTokens(
            admin_pb2.ListTokensRequest(namespace=data.draw(namespaces)), timeout=10
        ),
    )
    revoke = admin_pb2.RevokeTokenRequest(
        token_id=data.draw(st.one_of(st.text(max_size=20), st.sampled_from(["0" * 16, "zz"])))
    )
    check(world, "RevokeToken", lambda: admin.RevokeToken(revoke, timeout=10))


METHODS = [
    f"/delayq.v1.DelayQueueService/{m}"
    for m in ("Enqueue", "EnqueueBatch", "Ack", "Release", "Nack", "ExtendLease", "Query", "Delete",
              "GetQueueStats", "ListDeadJobs", "RedriveDeadJobs", "PurgeDeadJobs")
] + [f"/delayq.v1.AdminService/{m}" for m in ("CreateToken", "ListTokens", "RevokeToken")]  # fmt: skip


@given(method=st.sampled_from(METHODS), raw=st.binary(max_size=200), own=st.booleans())
@FUZZ
def test_fuzz_raw_bytes(world: World, method: str, raw: bytes, own: bool) -> None:
    """Undecodable (or accidentally decodable) bytes straight onto the wire."""
    ch = world.srv.channel(world.a_token if own else world.b_token)
    call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
    before = world.foreign_before
    if not own:  # as tenant B, B's own keys may change: compare A-and-B-free keys only
        return _raw_as_b(world, method, call, raw)
    check(world, f"raw {method.rsplit('/', 1)[1]}", lambda: call(raw, timeout=10))
    assert world.foreign_before is before


def _raw_as_b(world: World, method: str, call: Any, raw: bytes) -> None:
    code = C.OK
    try:
        call(raw, timeout=10)
    except grpc.RpcError as exc:
        code = exc.code()
    _record(f"raw-as-B {method.rsplit('/', 1)[1]}", code)
    assert code in CANONICAL, f"{method}: {code}"
    # B is allowed to change B's keys; refresh the baseline so later checks stay exact.
    world.foreign_before = foreign_digest(world.redis)


def test_server_still_healthy(world: World) -> None:
    ch = world.srv.channel(None)
    resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING
