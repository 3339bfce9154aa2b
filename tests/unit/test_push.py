"""Push delivery's pure parts: config checks, the SSRF address rules, Retry-After, excerpts."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from delayq_server.push import config, sender, signing, ssrf
from delayq_server.store import Claimed, JobRecord, JobState, ShardKeys

SECRET = "0123456789abcdef0123"


def _target(**kw: Any) -> dict[str, Any]:
    return {"queue": "q", "url": "https://hooks.example.com/x", "secret": SECRET, **kw}


def test_a_minimal_target_gets_safe_defaults() -> None:
    (t,) = config.parse({"targets": [_target()]}).targets
    assert (t.namespace, t.method, t.success, t.allow_http) == ("default", "POST", "2xx", False)
    assert (t.timeout_ms, t.concurrency, t.allow_hosts, t.allow_nets) == (
        10_000,
        8,
        frozenset(),
        (),
    )
    assert t.host_port == "hooks.example.com:443"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], 'want a JSON object with a "targets" list'),
        ({"targets": []}, "targets: want a non-empty list"),
        ({"targets": [], "extra": 1}, "unknown field 'extra'"),
        ({"targets": [_target(url="http://x.example/")]}, "targets[0].url: https is required"),
        (
            {"targets": [_target(url="ftp://x.example/")]},
            "targets[0].url: want an absolute https:// URL",
        ),
        (
            {"targets": [_target(url="https://u:p@x.example/")]},
            "targets[0].url: credentials in the URL",
        ),
        ({"targets": [_target(queue="a:b")]}, "targets[0].queue: want 1-64 letters"),
        ({"targets": [_target(method="GET")]}, "targets[0].method: want one of POST, PUT, PATCH"),
        ({"targets": [_target(success="3xx")]}, 'targets[0].success: want "2xx" or "later"'),
        ({"targets": [_target(timeout="1ms")]}, "targets[0].timeout: must be 100ms to 300000ms"),
        ({"targets": [_target(timeout="soon")]}, "targets[0].timeout: not a duration"),
        (
            {"targets": [_target(concurrency=0)]},
            "targets[0].concurrency: want a whole number from 1",
        ),
        ({"targets": [_target(concurrency=True)]}, "targets[0].concurrency: want a whole number"),
        (
            {"targets": [_target(headers={"Host": "x"})]},
            "targets[0].headers: 'Host' is set by the pusher",
        ),
        (
            {"targets": [_target(headers={"X": "a\r\nB: c"})]},
            "targets[0].headers.X: want a one-line string",
        ),
        ({"targets": [_target(allowlist="10.0.0.0/8")]}, "targets[0].allowlist: want a list"),
        (
            {"targets": [_target(allowlist=["bad host"])]},
            "targets[0].allowlist[0]: 'bad host' is not",
        ),
        (
            {"targets": [{"queue": "q", "url": "https://x.example/"}]},
            'targets[0]: give exactly one of "secret"',
        ),
        (
            {"targets": [_target(secret_file="/nonexistent/s")]},
            'targets[0]: give exactly one of "secret"',
        ),
        ({"targets": [_target(), _target()]}, "targets[1]: default/q has a target already"),
        ({"targets": [_target(lease="1s")]}, "targets[0]: unknown field 'lease'"),
        ({"targets": [_target()], "retry_after_max": "8d"}, "retry_after_max: must be 0ms to"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(raw: object, message: str) -> None:
    with pytest.raises(config.PushConfigError) as err:
        config.parse(raw)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_secret_file_is_read_relative_to_the_config(tmp_path: Any) -> None:
    (tmp_path / "s.txt").write_text(SECRET + "\n")
    raw = {"targets": [{"queue": "q", "url": "https://x.example/", "secret_file": "s.txt"}]}
    (t,) = config.parse(raw, str(tmp_path)).targets
    assert t.secret == SECRET.encode()


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
        ("fd12::1", "private"), ("169.254.169.254", "cloud metadata"),
        ("fd00:ec2::254", "cloud metadata"), ("169.254.1.1", "link-local"),
        ("fe80::1", "link-local"), ("100.64.0.1", "carrier-grade NAT"),
        ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"),
        ("::", "unspecified"), ("192.0.2.1", "private"), ("240.0.0.1", "private"),
        ("93.184.215.14", None), ("2606:4700::1111", None), ("8.8.8.8", None),
    ],
)  # fmt: skip
def test_address_rules(address: str, why: str | None) -> None:
    assert ssrf.refusal(ipaddress.ip_address(address)) == why


def test_allowlist_opens_a_cidr_or_a_host() -> None:
    by_net = config.parse({"targets": [_target(allowlist=["10.0.0.0/8"])]}).targets[0]
    ssrf.check(ipaddress.ip_address("10.9.9.9"), by_net)
    with pytest.raises(ssrf.RefusedAddress, match=r"address 10\.9\.9\.9 refused \(private"):
        ssrf.check(
            ipaddress.ip_address("10.9.9.9"), config.parse({"targets": [_target()]}).targets[0]
        )
    with pytest.raises(ssrf.RefusedAddress):
        ssrf.check(ipaddress.ip_address("192.168.0.1"), by_net)
    by_host = config.parse(
        {"targets": [_target(url="https://hooks.internal/", allowlist=["hooks.internal"])]}
    ).targets[0]
    ssrf.check(ipaddress.ip_address("10.9.9.9"), by_host)


def test_retry_after_seconds_date_and_cap() -> None:
    assert sender.retry_after_ms("120", 3_600_000) == 120_000
    assert sender.retry_after_ms("99999", 60_000) == 60_000
    assert (
        sender.retry_after_ms("Wed, 21 Oct 2015 07:28:30 GMT", 60_000, now_s=1445412480) == 30_000
    )
    assert sender.retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT", 60_000, now_s=1445412510) == 0
    assert sender.retry_after_ms("soon", 60_000) is None
    assert sender.retry_after_ms(None, 60_000) is None


def test_excerpt_is_at_most_200_bytes_of_one_line() -> None:
    text = sender.excerpt(("é" * 300).encode())
    assert len(text.encode()) <= 200 and set(text) == {"é"}
    assert sender.excerpt(b"a\r\nb\x00c") == "a  b c"


def _claimed(payload: bytes) -> Claimed:
    rec = JobRecord(
        JobState.LEASED, 2, 5, 1_700_000_000_123, 0, 0, 0, 0, "n", "", 0, 0, 2.0, 0.0,
        {"k": "v"}, payload,
    )  # fmt: skip
    return Claimed("jobid", "n", rec, 0)


def test_body_carries_text_or_base64() -> None:
    keys = ShardKeys("ns", "q", 0)
    text = sender.body(keys, _claimed(b"hi"))
    assert text == (
        b'{"id":"jobid","namespace":"ns","queue":"q","attempt":2,"max_attempts":5,'
        b'"due_time":"2023-11-14T22:13:20.123Z","headers":{"k":"v"},'
        b'"payload":"hi","payload_encoding":"utf-8"}'
    )
    assert b'"payload":"/w==","payload_encoding":"base64"' in sender.body(keys, _claimed(b"\xff"))


def test_signature_format() -> None:
    assert signing.sign(b"k", b"{}", now_s=1) == (
        "t=1,v1=" + __import__("hmac").new(b"k", b"1.{}", "sha256").hexdigest()
    )
