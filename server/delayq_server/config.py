"""Server configuration from flags, then environment (DELAYQ_*), then defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
    log_level: str = "INFO"
    clock_skew_ms: int = 0  # test only: shifts the local wall clock (docs/chaos.md)
    otel: bool = False  # export traces/metrics over OTLP (OTEL_EXPORTER_OTLP_* env)


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
    "log_level": ("DELAYQ_LOG_LEVEL", str, "logging level"),
    "clock_skew_ms": (
        "DELAYQ_CLOCK_SKEW",
        parse_signed_ms,
        "test only: skew the local wall clock, e.g. --clock-skew=-5m",
    ),
}


def _convert(kind: Callable[[str], object] | None, value: str) -> object:
    if kind is None:  # a duration
        return parse_ms(value)
    return kind(value)


def load(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> Config:
    """Builds the config; flags win over environment, environment over defaults."""
    env = dict(os.environ) if env is None else env
    parser = argparse.ArgumentParser(prog="delayq-server", description="delayq gRPC server")
    for name, (var, _kind, text) in _FLAGS.items():
        flag = "--" + name.removesuffix("_ms").replace("_", "-")
        parser.add_argument(flag, dest=name, default=None, help=f"{text} (env {var})")
    parser.add_argument("--otel", action="store_true", default=None, help="export OTLP telemetry")
    ns = parser.parse_args(argv)
    values: dict[str, object] = {}
    for name, (var, kind, _text) in _FLAGS.items():
        raw = getattr(ns, name)
        if raw is None:
            raw = env.get(var) or None
        if raw is not None:
            try:
                values[name] = _convert(kind, raw)
            except ValueError as exc:
                parser.error(f"{name}: {exc}")
    if ns.otel or env.get("DELAYQ_OTEL", "") in ("1", "true"):
        values["otel"] = True
    cfg = Config(**values)  # type: ignore[arg-type]
    if cfg.shards_per_queue < 1 or cfg.shards_per_queue > 1024:
        parser.error("shards_per_queue: must be 1 to 1024")
    # Imported here: validation imports this module.
    from delayq_server.validation import max_delivery_bytes

    largest = max_delivery_bytes(cfg.max_payload_bytes)
    if cfg.max_response_bytes < largest:
        parser.error(
            f"max_response_bytes: {cfg.max_response_bytes} is below the largest delivery "
            f"({largest} bytes with max_payload_bytes {cfg.max_payload_bytes}): "
            "a single job must always fit in one message"
        )
    return cfg
