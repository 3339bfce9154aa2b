"""Unit tests of the client library: no server, no Redis."""

from __future__ import annotations

import io
import random
from datetime import UTC, datetime, timedelta, timezone

import grpc
import pytest

from delayq import Backoff, JsonSerializer, Message, RetryPolicy
from delayq._common import chunk_requests
from delayq._convert import (
    batch_requests,
    enqueue_request,
    from_duration,
    from_timestamp,
    parse_duration_text,
    to_duration,
    to_timestamp,
)
from delayq._progress import Progress
from delayq.cli import build_parser, main
from delayq.errors import NotFoundError, UnavailableError, from_status
from delayq.serializers import CONTENT_TYPE_HEADER, decode_payload, encode_payload

JSON = JsonSerializer()


@pytest.mark.parametrize(
    ("payload", "data", "ctype"),
    [
        (b"\x00\x01", b"\x00\x01", None),
        ("héllo", "héllo".encode(), "text/plain; charset=utf-8"),
        ({"a": [1, 2]}, b'{"a":[1,2]}', "application/json"),
    ],
)
def test_payload_round_trips_by_content_type(
    payload: object, data: bytes, ctype: str | None
) -> None:
    assert encode_payload(payload, JSON) == (data, ctype)
    headers = {CONTENT_TYPE_HEADER: ctype} if ctype else {}
    assert decode_payload(data, headers, JSON) == payload


def test_unknown_content_type_stays_bytes() -> None:
    assert decode_payload(b"x", {CONTENT_TYPE_HEADER: "application/x-other"}, JSON) == b"x"


def test_durations_and_timestamps() -> None:
    d = to_duration(timedelta(seconds=90, microseconds=250))
    assert (d.seconds, d.nanos) == (90, 250_000)
    assert from_duration(to_duration(1.5)) == timedelta(seconds=1.5)
    moment = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2)))
    assert from_timestamp(to_timestamp(moment)) == moment
    assert from_timestamp(to_timestamp(moment)).tzinfo == UTC
    with pytest.raises(TypeError):
        to_duration("10s")  # type: ignore[arg-type]
    # Whole seconds take a shortcut: the same message as through timedelta.
    for seconds in (0, 1, 3600, -5, 10**9):
        assert to_duration(seconds) == to_duration(timedelta(seconds=seconds))
        assert to_duration(float(seconds)) == to_duration(timedelta(seconds=seconds))
    for fraction in (0.5, -2.25, 3600.001):
        assert to_duration(fraction) == to_duration(timedelta(seconds=fraction))
    with pytest.raises(TypeError):
        to_duration(True)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("250ms", 0.25), ("10s", 10), ("5m", 300), ("1h30m", 5400), ("2d", 172800), ("1.5", 1.5)],
)
def test_parse_duration_text(text: str, seconds: float) -> None:
    assert parse_duration_text(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "10x", "s", "5m junk"])
def test_parse_duration_text_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration_text(text)


def test_enqueue_request_fields() -> None:
    policy = RetryPolicy(initial_backoff=timedelta(seconds=1), multiplier=3.0)
    req = enqueue_request(
        "ns", "q", {"a": 1}, JSON, delay=5, ttl=60, max_attempts=3, retry=policy,
        headers={"x": "y"}, idempotency_key="k",
    )  # fmt: skip
    assert req.WhichOneof("schedule") == "delay" and req.delay.seconds == 5
    assert (req.ttl.seconds, req.max_attempts, req.idempotency_key) == (60, 3, "k")
    assert (req.retry.initial_backoff.seconds, req.retry.multiplier) == (1, 3.0)
    assert not req.retry.HasField("max_backoff")
    assert dict(req.headers) == {"x": "y", CONTENT_TYPE_HEADER: "application/json"}
    at = enqueue_request("ns", "q", b"b", JSON, at=datetime(2030, 1, 1, tzinfo=UTC))
    assert at.WhichOneof("schedule") == "due_time" and not at.headers


def test_batch_messages_override_call_options() -> None:
    reqs = batch_requests(
        "ns", "q", ["a", Message("b", delay=1, queue="other", idempotency_key="i")], JSON,
        {"delay": 9, "at": None, "ttl": None, "max_attempts": 2, "retry": None, "headers": None},
    )  # fmt: skip
    assert (reqs[0].queue, reqs[0].delay.seconds, reqs[0].max_attempts) == ("q", 9, 2)
    assert (reqs[1].queue, reqs[1].delay.seconds, reqs[1].max_attempts) == ("other", 1, 2)
    assert reqs[1].idempotency_key == "i"


def test_chunks_respect_count_and_bytes() -> None:
    reqs = [enqueue_request("ns", "q", b"x" * 100, JSON) for _ in range(25)]
    assert [len(c) for c in chunk_requests(reqs, 10, 10**6)] == [10, 10, 5]
    assert all(len(c) <= 4 for c in chunk_requests(reqs, 1000, 500))


def test_backoff_grows_caps_and_jitters() -> None:
    b = Backoff(initial=0.1, maximum=1.0, multiplier=2.0, jitter=0.0)
    assert [b.delay(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.delay(10_000) == 1.0
    rng = random.Random(7)
    jittered = Backoff(initial=1.0, maximum=1.0, jitter=0.5)
    values = [jittered.delay(0, rng) for _ in range(200)]
    assert min(values) >= 0.5 and max(values) <= 1.0 and len(set(values)) > 100
    with pytest.raises(ValueError):
        Backoff(initial=0)


def test_errors_map_status_codes() -> None:
    assert isinstance(from_status(5, "gone"), NotFoundError)
    err = from_status(grpc.StatusCode.UNAVAILABLE, "down")
    assert isinstance(err, UnavailableError) and str(err) == "UNAVAILABLE: down"


def test_progress_bar_renders() -> None:
    out = io.StringIO()
    bar = Progress(200, out, enabled=True)
    bar.update(200)
    bar.close()
    assert "200/200 100%" in out.getvalue() and out.getvalue().endswith("\n")


def test_cli_parses_options_after_payloads() -> None:
    args = build_parser().parse_args(["enqueue", "q", "a", "--delay", "5m"])
    assert args.delay == timedelta(minutes=5)


def test_cli_input_errors_exit_3(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["enqueue", "q"]) == 3
    assert capsys.readouterr().err.startswith("delayq: error: give PAYLOAD arguments or --file")
