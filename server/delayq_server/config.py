"""Server configuration from flags, then environment (DELAYQ_*), then defaults."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import NoReturn
from urllib.parse import urlsplit

from delayq_server.durations import parse_ms, parse_signed_ms


@dataclass(frozen=True, slots=True)
class Config:
    redis_url: str | None = None  # None: start a managed local redis-server
    listen: str = "127.0.0.1:50051"
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
    log_level: str = "INFO"
    clock_skew_ms: int = 0  # test only: shifts the local wall clock (docs/chaos.md)
    otel: bool = False  # export traces/metrics over OTLP (OTEL_EXPORTER_OTLP_* env)
    record_events: bool = False  # lifecycle events to per-shard streams (store/lifecycle.py)
    events_maxlen: int = 1_000_000  # per shard stream, approximate (MAXLEN ~)


# flag name -> (env var, parser, help)
_FLAGS: dict[str, tuple[str, Callable[[str], object] | None, str]] = {
    "redis_url": ("DELAYQ_REDIS_URL", str, "Redis URL; unset starts a managed redis-server"),
    "listen": ("DELAYQ_LISTEN", str, "gRPC listen address host:port (port 0 = any)"),
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
    "log_level": ("DELAYQ_LOG_LEVEL", str, "logging level"),
    "events_maxlen": ("DELAYQ_EVENTS_MAXLEN", int, "entries kept per shard's events stream"),
    "clock_skew_ms": (
        "DELAYQ_CLOCK_SKEW",
        parse_signed_ms,
        "test only: skew the local wall clock, e.g. --clock-skew=-5m",
    ),
}


class ConfigError(ValueError):
    """A setting out of range; the message names the flag."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


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
    # The server's own gRPC send limit is 64 MiB (app.SERVER_OPTIONS).
    "max_response_bytes": (1, 64 * _MIB, f"1 to {64 * _MIB}"),
    "shards_per_queue": (1, 1024, "1 to 1024"),
    "completed_retention_ms": (0, 366 * _DAY_MS, "0 (off) to 366d"),
    # 0 would make every idempotent enqueue fail (Redis refuses SET ... PX 0).
    "idempotency_window_ms": (1_000, 366 * _DAY_MS, "1s to 366d"),
    "bucket_width_ms": (1, 3_600_000, "1ms to 1h"),
    "grace_ms": (0, 3_600_000, "0 to 1h"),
    "wake_fallback_ms": (100, _DAY_MS, "100ms to 1d"),
    "events_maxlen": (1, 1_000_000_000, "1 to 1000000000"),
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
    if cfg.redis_url is not None:
        scheme = urlsplit(cfg.redis_url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ConfigError(
                f"--redis-url: {cfg.redis_url!r} is not a redis://, rediss:// or unix:// URL"
            )
    host, sep, port = cfg.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--listen: {cfg.listen!r} is not host:port (port 0 picks one)")
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


def load(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> Config:
    """Builds and checks the config; flags win over environment, environment over defaults.

    A bad value exits with one line on stderr (status 2).
    """
    env = dict(os.environ) if env is None else env
    parser = _Parser(prog="delayq-server", description="delayq gRPC server")
    for name, (var, _kind, text) in _FLAGS.items():
        parser.add_argument(flag_of(name), dest=name, default=None, help=f"{text} (env {var})")
    parser.add_argument("--otel", action="store_true", default=None, help="export OTLP telemetry")
    parser.add_argument(
        "--record-events",
        action="store_true",
        default=None,
        help="record lifecycle events to per-shard Redis streams (env DELAYQ_RECORD_EVENTS=1)",
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
    if ns.otel or env.get("DELAYQ_OTEL", "") in ("1", "true"):
        values["otel"] = True
    if ns.record_events or env.get("DELAYQ_RECORD_EVENTS", "") in ("1", "true"):
        values["record_events"] = True
    cfg = Config(**values)  # type: ignore[arg-type]
    try:
        check(cfg)
    except ConfigError as exc:
        fail(str(exc))
    return cfg


assert {f.name for f in fields(Config)} >= set(_RANGES)
