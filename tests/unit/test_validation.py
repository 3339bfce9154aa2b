"""Pure validation and parsing: no Redis, no server."""

from __future__ import annotations

import pytest
from google.protobuf import duration_pb2

from delayq.v1 import service_pb2
from delayq_server import config, ids, validation
from delayq_server.durations import parse_ms
from delayq_server.errors import InvalidArgument
from delayq_server.store import records

CFG = config.Config()


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("30s", 30_000), ("5m", 300_000), ("1h30m", 5_400_000), ("2", 2_000)],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_ms(text) == ms


@pytest.mark.parametrize("text", ["", "5x", "1h-", "ms", "-1s"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ms(text)


@pytest.mark.parametrize("name", ["a", "emails", "A-b_c.d", "9" * 64])
def test_good_names(name: str) -> None:
    assert validation.name("queue", name) == name


@pytest.mark.parametrize("name", ["-a", "a{b", "a}b", "a:b", "a/b", "a b", "é", "9" * 65])
def test_bad_names_never_reach_keys(name: str) -> None:
    with pytest.raises(InvalidArgument, match=r"^queue: "):
        validation.name("queue", name)


def test_empty_namespace_is_default() -> None:
    assert validation.namespace("") == "default"


def test_enqueue_defaults_come_from_config() -> None:
    inp = validation.enqueue(service_pb2.EnqueueRequest(queue="q", payload=b"x"), CFG).spec
    assert (inp.delay_ms, inp.due_at_ms, inp.ttl_ms) == (0, None, 0)
    assert inp.max_attempts == CFG.default_max_attempts
    assert (inp.backoff_initial_ms, inp.multiplier) == (CFG.retry_initial_ms, CFG.retry_multiplier)


def test_refusals_start_with_the_field() -> None:
    # EnqueueBatch names the item by putting "requests[i]." in front of the message.
    with pytest.raises(InvalidArgument, match=r"^payload: must not be empty$"):
        validation.enqueue(service_pb2.EnqueueRequest(queue="q"), CFG)


def test_nanos_are_checked() -> None:
    bad = duration_pb2.Duration(seconds=1, nanos=2_000_000_000)
    with pytest.raises(InvalidArgument, match="delay"):
        validation.duration_ms("delay", bad, lo=0, hi=10_000)


def test_job_ids_and_tokens_round_trip() -> None:
    one, many = ids.new_job_id(0, 1), ids.new_job_id(5, 8)
    assert len(one) == 23 and ids.shard_of(one) == 0
    assert many.endswith("-5") and ids.shard_of(many) == 5
    assert ids.shard_of("x" * 23) is None and ids.shard_of("../../etc") is None
    token = ids.parse_token(f"ns/q.1/5/{many}/abcd1234.3.7.2")
    assert token is not None
    assert (token.keys.namespace, token.keys.queue, token.keys.shard) == ("ns", "q.1", 5)
    assert (token.job_id, token.server_id, token.stream_seq) == (many, "abcd1234", "3")
    assert str(token) == f"ns/q.1/5/{many}/abcd1234.3.7.2"
    assert ids.parse_token("ns/q{x}/0/" + one + "/a.1.1.1") is None


def test_ids_sort_by_creation_time() -> None:
    a = ids.new_job_id(0, 1)
    b = ids.new_job_id(0, 1)
    assert a[:9] <= b[:9]  # the first 48 bits are the millisecond timestamp


def test_config_flags_beat_environment() -> None:
    cfg = config.load(
        ["--default-lease", "45s", "--shards-per-queue", "4"],
        env={"DELAYQ_DEFAULT_LEASE": "10s", "DELAYQ_MAX_PAYLOAD_BYTES": "1024"},
    )
    assert (cfg.default_lease_ms, cfg.shards_per_queue, cfg.max_payload_bytes) == (45_000, 4, 1024)
    assert cfg.redis_url is None


def test_event_recording_is_off_unless_asked_for() -> None:
    assert config.load([], env={}).record_events is False
    on = config.load(["--record-events", "--events-maxlen", "500"], env={})
    assert (on.record_events, on.events_maxlen) == (True, 500)
    assert config.load([], env={"DELAYQ_RECORD_EVENTS": "1"}).record_events is True


def test_config_refuses_nonsense() -> None:
    with pytest.raises(SystemExit):
        config.load(["--default-lease", "soon"], env={})


def test_state_of_a_due_scheduled_record_reads_ready() -> None:
    rec = records.JobRecord(
        records.JobState.SCHEDULED, 0, 3, 1000, 0, 0, 0, 0, "", "", 0, 0, 2.0, 0.0, {}, b""
    )
    assert rec.state_at(999) is records.JobState.SCHEDULED
    assert rec.state_at(1000) is records.JobState.READY


def test_job_id_encoding_is_base32hex_of_time_and_random() -> None:
    """The table encoder gives exactly base64.b32hexencode's digits (ids stay sortable)."""
    import base64
    import random

    rng = random.Random(7)
    for _ in range(2000):
        ms, rand = rng.getrandbits(48), rng.getrandbits(64)
        raw = ms.to_bytes(6, "big") + rand.to_bytes(8, "big")
        want = base64.b32hexencode(raw).decode().rstrip("=").lower()
        assert ids.encode_id(ms, rand) == want


MAX_S, MAX_REST_NS = divmod(validation.MAX_DELAY_MS * 1_000_000, 1_000_000_000)


@pytest.mark.parametrize(
    ("seconds", "nanos", "expected"),
    [
        (0, 999_999_999, 999),
        (MAX_S, MAX_REST_NS, validation.MAX_DELAY_MS),  # the horizon itself
        (MAX_S, MAX_REST_NS + 1_000_000, None),  # one ms past it
        (-1, 0, None),
        (1, -1, None),
        (0, 1_000_000_000, None),
        (-1, 1_500_000_000, None),  # sums to a valid 500 ms, still refused
    ],
)
def test_delay_bounds(seconds: int, nanos: int, expected: int | None) -> None:
    req = service_pb2.EnqueueRequest(queue="q", payload=b"x")
    req.delay.seconds, req.delay.nanos = seconds, nanos
    if expected is None:
        with pytest.raises(InvalidArgument, match=r"^delay: "):
            validation.enqueue(req, CFG)
    else:
        assert validation.enqueue(req, CFG).spec.delay_ms == expected


@pytest.mark.parametrize(
    ("headers", "field"),
    [
        ({f"k{i}": "v" for i in range(validation.MAX_HEADERS + 1)}, "headers"),
        ({"é" * 129: "v"}, "headers"),  # 258 UTF-8 bytes
        ({"k": "v" * (validation.MAX_HEADER_VALUE + 1)}, "headers['k']"),
    ],
)
def test_header_refusals_name_the_field(headers: dict[str, str], field: str) -> None:
    req = service_pb2.EnqueueRequest(queue="q", payload=b"x", headers=headers)
    with pytest.raises(InvalidArgument) as refused:
        validation.enqueue(req, CFG)
    assert refused.value.message.startswith(field + ": ")
