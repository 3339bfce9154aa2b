"""The push config file (--push-config, DELAYQ_PUSH_CONFIG): targets per queue, checked at start."""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from delayq_server.durations import parse_ms

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # validation.name's allowlist
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")  # RFC 9110 token
# Set by the pusher itself: a static header must not forge or break them.
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "host",
        "transfer-encoding",
        "connection",
        "delayq-signature",
        "delayq-job-id",
        "delayq-attempt",
        "traceparent",
        "tracestate",
    }
)
METHODS = ("POST", "PUT", "PATCH")
SUCCESS_MODES = ("2xx", "later")
MIN_TIMEOUT_MS, MAX_TIMEOUT_MS = 100, 300_000
MAX_CONCURRENCY = 1000
MAX_RETRY_AFTER_MS = 7 * 86_400_000
MAX_RESPONSE_BYTES = 1024 * 1024


class PushConfigError(ValueError):
    """A bad push config; the message names the field (``targets[0].url: ...``)."""


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how one queue's jobs are pushed."""

    namespace: str
    queue: str
    url: str
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    timeout_ms: int = 10_000
    concurrency: int = 8
    success: str = "2xx"  # or "later": 2xx with JSON {"code": 100}
    allow_http: bool = False
    allow_hosts: frozenset[str] = frozenset()  # host names whose every address is allowed
    allow_nets: tuple[Network, ...] = ()  # addresses allowed although not public
    secret: bytes = b""
    max_response_bytes: int = 64 * 1024

    @property
    def host(self) -> str:
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def host_port(self) -> str:
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return f"{(parts.hostname or '').lower()}:{port}"

    @property
    def host_allowlisted(self) -> bool:
        return self.host in self.allow_hosts


@dataclass(frozen=True, slots=True)
class PushConfig:
    targets: tuple[Target, ...]
    per_host_concurrency: int = 64  # requests in flight to one host:port over all targets
    retry_after_max_ms: int = 3_600_000  # a receiver's Retry-After is capped at this


def _duration(where: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise PushConfigError(f'{where}: want a duration like "10s" or "250ms"')
    try:
        ms = parse_ms(str(value))
    except ValueError as exc:
        raise PushConfigError(f"{where}: {exc}") from None
    if not lo <= ms <= hi:
        raise PushConfigError(f"{where}: must be {lo}ms to {hi}ms, got {ms}ms")
    return ms


def _int(where: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PushConfigError(f"{where}: want a whole number from {lo} to {hi}, got {value!r}")
    return value


def _str(where: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise PushConfigError(f"{where}: want a non-empty string")
    return value


def _url(where: str, value: object, allow_http: bool) -> str:
    url = _str(where, value)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise PushConfigError(f"{where}: {exc}") from None
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise PushConfigError(f"{where}: want an absolute https:// URL, got {url!r}")
    if parts.scheme == "http" and not allow_http:
        raise PushConfigError(
            f'{where}: https is required (set "allow_http": true on this target to allow http://)'
        )
    if parts.username is not None or parts.password is not None:
        raise PushConfigError(f'{where}: credentials in the URL: put them in "headers"')
    if parts.fragment:
        raise PushConfigError(f"{where}: a URL fragment is never sent; remove it")
    return url


def _headers(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PushConfigError(f"{where}: want an object of header name -> value")
    out: dict[str, str] = {}
    for name, text in value.items():
        if not _HEADER_NAME.match(name):
            raise PushConfigError(f"{where}: {name!r} is not a valid header name")
        if name.lower() in RESERVED_HEADERS:
            raise PushConfigError(
                f"{where}: {name!r} is set by the pusher and cannot be configured"
            )
        if not isinstance(text, str) or any(c in text for c in "\r\n\0"):
            raise PushConfigError(f"{where}.{name}: want a one-line string")
        out[name] = text
    return out


def _allowlist(where: str, value: object) -> tuple[frozenset[str], tuple[Network, ...]]:
    if not isinstance(value, list):
        raise PushConfigError(f"{where}: want a list of host names, addresses or CIDRs")
    hosts: set[str] = set()
    nets: list[Network] = []
    for i, entry in enumerate(value):
        text = _str(f"{where}[{i}]", entry).strip().lower()
        try:
            nets.append(ipaddress.ip_network(text, strict=False))
            continue
        except ValueError:
            pass
        if "/" in text or not re.fullmatch(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?", text):
            raise PushConfigError(f"{where}[{i}]: {entry!r} is not a host name, address or CIDR")
        hosts.add(text)
    return frozenset(hosts), tuple(nets)


def _secret(where: str, raw: dict[str, Any], base_dir: str) -> bytes:
    secret, path = raw.get("secret"), raw.get("secret_file")
    if (secret is None) == (path is None):
        raise PushConfigError(f'{where}: give exactly one of "secret" or "secret_file" (HMAC key)')
    if secret is not None:
        value = _str(f"{where}.secret", secret).encode()
    else:
        import os.path

        file = os.path.join(base_dir, _str(f"{where}.secret_file", path))
        try:
            with open(file, "rb") as f:
                value = f.read().strip()
        except OSError as exc:
            raise PushConfigError(
                f"{where}.secret_file: cannot read {file}: {exc.strerror}"
            ) from None
    if len(value) < 16:
        raise PushConfigError(f"{where}: the secret must be at least 16 bytes")
    return value


_TARGET_FIELDS = {
    "namespace", "queue", "url", "method", "headers", "timeout", "concurrency", "success",
    "allow_http", "allowlist", "secret", "secret_file", "max_response_bytes",
}  # fmt: skip


def _target(where: str, raw: object, base_dir: str) -> Target:
    if not isinstance(raw, dict):
        raise PushConfigError(f"{where}: want an object")
    unknown = sorted(set(raw) - _TARGET_FIELDS)
    if unknown:
        raise PushConfigError(f"{where}: unknown field {unknown[0]!r}")
    namespace = raw.get("namespace", "default")
    queue = raw.get("queue")
    for name, value in (("namespace", namespace), ("queue", queue)):
        if not isinstance(value, str) or not _NAME.match(value):
            raise PushConfigError(
                f"{where}.{name}: want 1-64 letters, digits, '_', '.' or '-', got {value!r}"
            )
    allow_http = raw.get("allow_http", False)
    if not isinstance(allow_http, bool):
        raise PushConfigError(f"{where}.allow_http: want true or false")
    method = raw.get("method", "POST")
    if method not in METHODS:
        raise PushConfigError(f"{where}.method: want one of {', '.join(METHODS)}, got {method!r}")
    success = raw.get("success", "2xx")
    if success not in SUCCESS_MODES:
        raise PushConfigError(f'{where}.success: want "2xx" or "later", got {success!r}')
    hosts, nets = _allowlist(f"{where}.allowlist", raw.get("allowlist", []))
    return Target(
        namespace=namespace,
        queue=queue,  # type: ignore[arg-type]  # checked above
        url=_url(f"{where}.url", raw.get("url"), allow_http),
        method=method,
        headers=_headers(f"{where}.headers", raw.get("headers", {})),
        timeout_ms=_duration(
            f"{where}.timeout", raw.get("timeout", "10s"), MIN_TIMEOUT_MS, MAX_TIMEOUT_MS
        ),
        concurrency=_int(f"{where}.concurrency", raw.get("concurrency", 8), 1, MAX_CONCURRENCY),
        success=success,
        allow_http=allow_http,
        allow_hosts=hosts,
        allow_nets=nets,
        secret=_secret(where, raw, base_dir),
        max_response_bytes=_int(
            f"{where}.max_response_bytes",
            raw.get("max_response_bytes", 64 * 1024),
            1,
            MAX_RESPONSE_BYTES,
        ),
    )


def parse(data: object, base_dir: str = ".") -> PushConfig:
    """Checks a decoded config; ``base_dir`` anchors relative secret_file paths."""
    if not isinstance(data, dict):
        raise PushConfigError('want a JSON object with a "targets" list')
    unknown = sorted(set(data) - {"targets", "per_host_concurrency", "retry_after_max"})
    if unknown:
        raise PushConfigError(f"unknown field {unknown[0]!r}")
    raw_targets = data.get("targets")
    if not isinstance(raw_targets, list) or not raw_targets:
        raise PushConfigError("targets: want a non-empty list")
    targets = tuple(_target(f"targets[{i}]", t, base_dir) for i, t in enumerate(raw_targets))
    seen: set[tuple[str, str]] = set()
    for i, t in enumerate(targets):
        if (t.namespace, t.queue) in seen:
            raise PushConfigError(f"targets[{i}]: {t.namespace}/{t.queue} has a target already")
        seen.add((t.namespace, t.queue))
    return PushConfig(
        targets,
        per_host_concurrency=_int(
            "per_host_concurrency", data.get("per_host_concurrency", 64), 1, 100_000
        ),
        retry_after_max_ms=_duration(
            "retry_after_max", data.get("retry_after_max", "1h"), 0, MAX_RETRY_AFTER_MS
        ),
    )


def load(path: str) -> PushConfig:
    """Reads and checks the file; PushConfigError carries a one-line reason."""
    import os.path

    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise PushConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PushConfigError(f"{path} is not JSON: {exc}") from None
    return parse(data, os.path.dirname(os.path.abspath(path)))
