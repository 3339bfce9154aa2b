"""Server configuration from flags, then environment (DELAYQ_*), then defaults."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from delayq_server.durations import parse_ms


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
    otel: bool = False  # export traces/metrics over OTLP (OTEL_EXPORTER_OTLP_* env)
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


# flag name -> (env var, parser, help)
_FLAGS: dict[str, tuple[str, type | None, str]] = {
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
}

# flag name -> (env var, help); "--x" sets True, "--no-x" False
_BOOLS: dict[str, tuple[str, str]] = {
    "otel": ("DELAYQ_OTEL", "export OTLP telemetry"),
    "auth": ("DELAYQ_AUTH", "require a token (or mapped client certificate) on every RPC"),
    "reflection": ("DELAYQ_REFLECTION", "serve gRPC reflection (default on)"),
}
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _convert(kind: type | None, value: str) -> object:
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
    for name, (var, text) in _BOOLS.items():
        parser.add_argument(
            "--" + name,
            action=argparse.BooleanOptionalAction,
            default=None,
            help=f"{text} (env {var})",
        )
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
            parser.error(f"{var}: want 1/true/on or 0/false/off, got {text!r}")
    cfg = Config(**values)  # type: ignore[arg-type]
    if cfg.shards_per_queue < 1 or cfg.shards_per_queue > 1024:
        parser.error("shards_per_queue: must be 1 to 1024")
    for name in ("quota_enqueue_rate", "quota_enqueue_burst", "quota_jobs", "quota_queues",
                 "quota_streams", "max_concurrent_rpcs"):  # fmt: skip
        if getattr(cfg, name) < 0:
            parser.error(f"{name}: must be 0 (no limit) or more")
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        parser.error("tls: give --tls-cert and --tls-key together")
    if cfg.tls_client_ca and not cfg.tls_cert:
        parser.error("tls: --tls-client-ca (mTLS) needs --tls-cert and --tls-key")
    if cfg.tls_client_roles and not cfg.tls_client_ca:
        parser.error("tls: --tls-client-roles needs --tls-client-ca (client certificates)")
    # Imported here: validation imports this module.
    from delayq_server.validation import max_delivery_bytes

    largest = max_delivery_bytes(cfg.max_payload_bytes)
    if cfg.max_response_bytes < largest:
        parser.error(
            f"max_response_bytes: {cfg.max_response_bytes} is below the largest delivery "
            f"({largest} bytes with max_payload_bytes {cfg.max_payload_bytes}): "
            "a single job must always fit in one message"
        )
    if cfg.max_message_bytes < cfg.max_response_bytes:
        parser.error(
            f"max_message_bytes: {cfg.max_message_bytes} is below max_response_bytes "
            f"({cfg.max_response_bytes}): Consume messages would not be sent"
        )
    return cfg
