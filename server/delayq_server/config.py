"""Server configuration from flags, then environment (DELAYQ_*), then defaults."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import NoReturn
from urllib.parse import parse_qsl, urlsplit

from delayq_server import cpu_affinity
from delayq_server.durations import parse_ms, parse_signed_ms


@dataclass(frozen=True, slots=True)
class Config:
    redis_url: str | None = None  # None: start a managed local redis-server
    listen: str = "127.0.0.1:50051"
    http_listen: str | None = None  # admin HTTP port (/metrics, dashboard); None: off
    data_dir: str = ".run/redis"  # managed redis-server's directory (AOF on)
    default_lease_ms: int = 30_000
    default_max_attempts: int = 10
    retry_initial_ms: int = 1_000
    retry_max_ms: int = 3_600_000
    retry_multiplier: float = 2.0
    retry_jitter: float = 0.2
    max_payload_bytes: int = 256 * 1024
    # Cap on one ConsumeResponse: well under a default gRPC client's 4 MiB receive
    # limit, and above the largest job (see validation.max_delivery_bytes).
    max_response_bytes: int = 1024 * 1024
    shards_per_queue: int = 1
    completed_retention_ms: int = 0
    idempotency_window_ms: int = 24 * 3_600_000
    bucket_width_ms: int = 1_000
    grace_ms: int = 10_000
    wake_fallback_ms: int = 30_000  # longest idle wait without a wake-up
    timer_coalesce_ms: int = 2  # due times closer than this share a wake-up (promoter.py)
    log_level: str = "INFO"
    log_format: str = "text"  # or "json": one JSON object per line (logs.py)
    clock_skew_ms: int = 0  # test only: shifts the local wall clock (docs/chaos.md)
    otel: bool = False  # export traces/metrics (otel_providers.py: OTEL_* environment)
    auth: bool = False  # bearer tokens / client certificates required (README "Auth")
    auth_bootstrap_token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None  # set: clients must present a certificate (mTLS)
    tls_client_roles: str | None = None  # JSON: certificate identity -> namespace + roles
    reflection: bool = True
    # Per-namespace quotas (README "Quotas"); 0 turns one off.
    quota_enqueue_rate: float = 100_000.0  # jobs/s
    quota_enqueue_burst: int = 200_000
    quota_jobs: int = 10_000_000  # stored jobs
    quota_queues: int = 1_000
    quota_streams: int = 1_000  # concurrent Consume streams over all replicas
    # Server-wide limits.
    max_concurrent_rpcs: int = 10_000  # streams included; more get RESOURCE_EXHAUSTED
    max_message_bytes: int = 16 * 1024 * 1024  # largest request or response message
    record_events: bool = False  # lifecycle events to per-shard streams (store/lifecycle.py)
    events_maxlen: int = 1_000_000  # per shard stream, approximate (MAXLEN ~)
    workers: int = 1  # server processes sharing the port (workers.py)
    cpu_affinity: str = "off"  # off, auto or CPUs: one CPU per server process (cpu_affinity.py)
    reuse_port: bool = False  # set by the supervisor for its workers only
    push_config: str | None = None  # JSON push targets: set, this process pushes (push/)
    push: bool = False  # push queues whose admin settings hold a target (implied by push_config)


# flag name -> (env var, parser, help)
_FLAGS: dict[str, tuple[str, Callable[[str], object] | None, str]] = {
    "redis_url": ("DELAYQ_REDIS_URL", str, "Redis URL; unset starts a managed redis-server"),
    "listen": ("DELAYQ_LISTEN", str, "gRPC listen address host:port (port 0 = any)"),
    "http_listen": (
        "DELAYQ_HTTP_LISTEN",
        str,
        "admin HTTP address host:port for /healthz, /metrics, dashboard (off when unset)",
    ),
    "data_dir": ("DELAYQ_DATA_DIR", str, "data directory of the managed redis-server"),
    "default_lease_ms": ("DELAYQ_DEFAULT_LEASE", None, "lease when Consume sets none"),
    "default_max_attempts": ("DELAYQ_DEFAULT_MAX_ATTEMPTS", int, "attempts when a job sets none"),
    "retry_initial_ms": ("DELAYQ_RETRY_INITIAL", None, "default first retry backoff"),
    "retry_max_ms": ("DELAYQ_RETRY_MAX", None, "default backoff cap"),
    "retry_multiplier": ("DELAYQ_RETRY_MULTIPLIER", float, "default backoff growth"),
    "retry_jitter": ("DELAYQ_RETRY_JITTER", float, "default backoff jitter fraction"),
    "max_payload_bytes": ("DELAYQ_MAX_PAYLOAD_BYTES", int, "payload size limit"),
    "max_response_bytes": (
        "DELAYQ_MAX_RESPONSE_BYTES",
        int,
        "byte cap on one Consume stream message (default 1 MiB)",
    ),
    "shards_per_queue": ("DELAYQ_SHARDS_PER_QUEUE", int, "shards of a newly created queue"),
    "completed_retention_ms": ("DELAYQ_COMPLETED_RETENTION", None, "keep acked jobs this long"),
    "idempotency_window_ms": ("DELAYQ_IDEMPOTENCY_WINDOW", None, "idempotency key lifetime"),
    "bucket_width_ms": ("DELAYQ_BUCKET_WIDTH", None, "backlog time-bucket width"),
    "grace_ms": ("DELAYQ_GRACE", None, "shutdown grace period"),
    "wake_fallback_ms": ("DELAYQ_WAKE_FALLBACK", None, "longest idle wait without a wake-up"),
    "timer_coalesce_ms": (
        "DELAYQ_TIMER_COALESCE",
        None,
        "due times closer than this share one promoter wake-up",
    ),
    "log_level": ("DELAYQ_LOG_LEVEL", str, "logging level"),
    "log_format": ("DELAYQ_LOG_FORMAT", str, "log lines as text or json"),
    "auth_bootstrap_token_file": (
        "DELAYQ_AUTH_BOOTSTRAP_TOKEN_FILE",
        str,
        "with --auth: admin token file, made at first start when missing",
    ),
    "tls_cert": ("DELAYQ_TLS_CERT", str, "PEM server certificate chain: serve TLS"),
    "tls_key": ("DELAYQ_TLS_KEY", str, "PEM private key of --tls-cert"),
    "tls_client_ca": ("DELAYQ_TLS_CLIENT_CA", str, "PEM CA bundle: require client certs (mTLS)"),
    "tls_client_roles": (
        "DELAYQ_TLS_CLIENT_ROLES",
        str,
        "JSON file: client certificate CN/SAN -> {namespace, roles}",
    ),
    "quota_enqueue_rate": (
        "DELAYQ_QUOTA_ENQUEUE_RATE",
        float,
        "jobs/s one namespace may enqueue (0: no limit)",
    ),
    "quota_enqueue_burst": ("DELAYQ_QUOTA_ENQUEUE_BURST", int, "enqueue token bucket size"),
    "quota_jobs": ("DELAYQ_QUOTA_JOBS", int, "jobs one namespace may store (0: no limit)"),
    "quota_queues": ("DELAYQ_QUOTA_QUEUES", int, "queues per namespace (0: no limit)"),
    "quota_streams": (
        "DELAYQ_QUOTA_STREAMS",
        int,
        "concurrent Consume streams per namespace (0: no limit)",
    ),
    "max_concurrent_rpcs": (
        "DELAYQ_MAX_CONCURRENT_RPCS",
        int,
        "RPCs (streams included) one replica serves at once",
    ),
    "max_message_bytes": ("DELAYQ_MAX_MESSAGE_BYTES", int, "largest gRPC message"),
    "events_maxlen": ("DELAYQ_EVENTS_MAXLEN", int, "entries kept per shard's events stream"),
    "workers": ("DELAYQ_WORKERS", int, "server processes sharing the port (1 to 64)"),
    "cpu_affinity": (
        "DELAYQ_CPU_AFFINITY",
        str,
        "keep each server process on one CPU: off (default), auto, or CPUs such as 2,3",
    ),
    "push_config": (
        "DELAYQ_PUSH_CONFIG",
        str,
        'JSON file of HTTP push targets per queue: this process pushes (README "Push delivery")',
    ),
    "clock_skew_ms": (
        "DELAYQ_CLOCK_SKEW",
        parse_signed_ms,
        "test only: skew the local wall clock, e.g. --clock-skew=-5m",
    ),
}

# flag name -> (env var, help); "--x" sets True, "--no-x" False
_BOOLS: dict[str, tuple[str, str]] = {
    "otel": (
        "DELAYQ_OTEL",
        "export traces and metrics (OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER, default otlp)",
    ),
    "auth": ("DELAYQ_AUTH", "require a token (or mapped client certificate) on every RPC"),
    "reflection": ("DELAYQ_REFLECTION", "serve gRPC reflection (default on)"),
    "record_events": (
        "DELAYQ_RECORD_EVENTS",
        "record lifecycle events to per-shard Redis streams",
    ),
    "push": (
        "DELAYQ_PUSH",
        'push queues whose settings hold a push target (README "Push delivery")',
    ),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConfigError(ValueError):
    """A setting out of range; the message names the flag."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def _check_redis_url(url: str) -> None:
    """Refuses what redis-py would only trip over at the first command. Messages
    name the scheme or parameter, never the URL: it may carry a password."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        raise ConfigError(
            f"--redis-url: scheme {parts.scheme + '://'!r} is not redis://, rediss://, "
            "unix:// or redis+cluster://"
        )
    # On a plaintext URL redis-py hands ssl_* to a plain connection: a TypeError
    # traceback instead of a refusal (docs/decisions.md, "rediss:// URLs").
    tls = {name for name, _ in parse_qsl(parts.query) if name.startswith("ssl_")}
    if tls and not parts.scheme.startswith("rediss"):
        raise ConfigError(
            f"--redis-url: {', '.join(sorted(tls))} is a TLS setting: use rediss:// "
            f"(or rediss+cluster://), {parts.scheme}:// is plaintext"
        )


def fail(message: str) -> NoReturn:
    """One line on stderr and exit status 2: how every start-up refusal looks."""
    sys.stderr.write(f"delayq-server: error: {message}\n")
    raise SystemExit(2)


def _convert(kind: Callable[[str], object] | None, value: str) -> object:
    if kind is None:  # a duration
        return parse_ms(value)
    return kind(value)


def flag_of(name: str) -> str:
    return "--" + name.removesuffix("_ms").replace("_", "-")


_DAY_MS = 86_400_000
_MIB = 1024 * 1024
# Inclusive ranges of numeric settings (durations in ms). The lease range is the
# one Consume accepts (validation.MIN_LEASE_MS / MAX_LEASE_MS); 366 days is the
# longest delay a job may have.
_RANGES: dict[str, tuple[float, float, str]] = {
    "default_lease_ms": (1_000, 12 * 3_600_000, "1s to 12h"),
    "default_max_attempts": (1, 1000, "1 to 1000"),
    "retry_initial_ms": (0, 366 * _DAY_MS, "0 to 366d"),
    "retry_max_ms": (0, 366 * _DAY_MS, "0 to 366d"),
    "retry_multiplier": (1.0, 10.0, "1.0 to 10.0"),
    "retry_jitter": (0.0, 1.0, "0.0 to 1.0"),
    "max_payload_bytes": (1, 32 * _MIB, f"1 to {32 * _MIB}"),
    # At most the server's own gRPC send limit (--max-message-bytes, checked below).
    "max_response_bytes": (1, 64 * _MIB, f"1 to {64 * _MIB}"),
    "max_message_bytes": (_MIB, 1024 * _MIB, f"{_MIB} to {1024 * _MIB}"),
    "quota_enqueue_rate": (0, 1e9, "0 (no limit) or more"),
    "quota_enqueue_burst": (0, 1e12, "0 (one second of rate) or more"),
    "quota_jobs": (0, 1e15, "0 (no limit) or more"),
    "quota_queues": (0, 1e9, "0 (no limit) or more"),
    "quota_streams": (0, 1e9, "0 (no limit) or more"),
    "max_concurrent_rpcs": (0, 1e9, "0 (no limit) or more"),
    "shards_per_queue": (1, 1024, "1 to 1024"),
    "completed_retention_ms": (0, 366 * _DAY_MS, "0 (off) to 366d"),
    # 0 would make every idempotent enqueue fail (Redis refuses SET ... PX 0).
    "idempotency_window_ms": (1_000, 366 * _DAY_MS, "1s to 366d"),
    "bucket_width_ms": (1, 3_600_000, "1ms to 1h"),
    "grace_ms": (0, 3_600_000, "0 to 1h"),
    "wake_fallback_ms": (100, _DAY_MS, "100ms to 1d"),
    "timer_coalesce_ms": (0, 1_000, "0 (off) to 1s"),
    "events_maxlen": (1, 1_000_000_000, "1 to 1000000000"),
    "workers": (1, 64, "1 to 64"),
    "clock_skew_ms": (-_DAY_MS, _DAY_MS, "-1d to 1d"),
}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def check(cfg: Config) -> None:
    """Refuses any setting outside its documented range (ConfigError names the flag)."""
    for name, (lo, hi, text) in _RANGES.items():
        value = getattr(cfg, name)
        if not lo <= value <= hi:
            unit = "ms" if name.endswith("_ms") else ""
            raise ConfigError(f"{flag_of(name)}: must be {text}, got {value}{unit}")
    if cfg.retry_max_ms < cfg.retry_initial_ms:
        raise ConfigError("--retry-max: must not be below --retry-initial")
    if cfg.log_level.upper() not in _LOG_LEVELS:
        raise ConfigError(f"--log-level: must be one of {', '.join(_LOG_LEVELS)}")
    if cfg.log_format not in ("text", "json"):
        raise ConfigError(f"--log-format: must be text or json, got {cfg.log_format!r}")
    if cfg.redis_url is not None:
        _check_redis_url(cfg.redis_url)
    for flag, address in (("--listen", cfg.listen), ("--http-listen", cfg.http_listen)):
        if address is None:
            continue
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ConfigError(f"{flag}: {address!r} is not host:port (port 0 picks one)")
    if cfg.redis_url is None and not cfg.data_dir:
        raise ConfigError("--data-dir: must not be empty")
    # Imported here: validation imports this module.
    from delayq_server.validation import max_delivery_bytes

    largest = max_delivery_bytes(cfg.max_payload_bytes)
    if cfg.max_response_bytes < largest:
        raise ConfigError(
            f"--max-response-bytes: {cfg.max_response_bytes} is below the largest delivery "
            f"({largest} bytes with --max-payload-bytes {cfg.max_payload_bytes}): "
            "a single job must always fit in one message"
        )
    if cfg.max_message_bytes < cfg.max_response_bytes:
        raise ConfigError(
            f"--max-message-bytes: {cfg.max_message_bytes} is below --max-response-bytes "
            f"({cfg.max_response_bytes}): Consume messages could not be sent"
        )
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        raise ConfigError("--tls-cert, --tls-key: give both together")
    if cfg.tls_client_ca and not cfg.tls_cert:
        raise ConfigError("--tls-client-ca: mutual TLS needs --tls-cert and --tls-key")
    if cfg.tls_client_roles and not cfg.tls_client_ca:
        raise ConfigError("--tls-client-roles: needs --tls-client-ca (client certificates)")
    try:
        cpu_affinity.cpus(cfg.cpu_affinity)
    except cpu_affinity.AffinityError as exc:
        raise ConfigError(f"--cpu-affinity: {exc}") from None


def load(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> Config:
    """Builds and checks the config; flags win over environment, environment over defaults.

    A bad value exits with one line on stderr (status 2).
    """
    env = dict(os.environ) if env is None else env
    parser = _Parser(prog="delayq-server", description="delayq gRPC server")
    for name, (var, _kind, text) in _FLAGS.items():
        parser.add_argument(flag_of(name), dest=name, default=None, help=f"{text} (env {var})")
    for name, (var, text) in _BOOLS.items():
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{text} (env {var})",
        )
    ns = parser.parse_args(argv)
    values: dict[str, object] = {}
    for name, (var, kind, _text) in _FLAGS.items():
        raw = getattr(ns, name)
        source = flag_of(name)
        if raw is None:
            raw = env.get(var) or None
            source = var
        if raw is not None:
            try:
                values[name] = _convert(kind, raw)
            except ValueError as exc:
                fail(f"{source}: {exc}")
    for name, (var, _text) in _BOOLS.items():
        flag = getattr(ns, name)
        text = env.get(var, "").lower()
        if flag is not None:
            values[name] = flag
        elif text in _TRUE:
            values[name] = True
        elif text in _FALSE:
            values[name] = False
        elif text:
            fail(f"{var}: want 1/true/on or 0/false/off, got {text!r}")
    if env.get("DELAYQ_REUSE_PORT", "") == "1":  # workers.REUSE_PORT_ENV, set for workers
        values["reuse_port"] = True
    cfg = Config(**values)  # type: ignore[arg-type]
    try:
        check(cfg)
    except ConfigError as exc:
        fail(str(exc))
    if cfg.push_config is not None:  # refused before anything starts
        from delayq_server.push.config import PushConfigError
        from delayq_server.push.config import load as load_push

        try:
            load_push(cfg.push_config)
        except PushConfigError as exc:
            fail(f"--push-config: {exc}")
    return cfg


assert {f.name for f in fields(Config)} >= set(_RANGES)
