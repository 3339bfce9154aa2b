"""Request validation: every field checked before anything touches Redis.

Pure functions from protobuf messages to store inputs; each refusal names the
field (``InvalidArgument``), so the caller knows what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import job_pb2, service_pb2
from delayq_server import ids
from delayq_server.config import Config
from delayq_server.errors import InvalidArgument
from delayq_server.store import JobSpec

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# One bound for delay and due_time (docs/decisions.md): a job falls due at most
# 366 days after the server's clock. It also keeps every time a Lua number can
# hold exactly and bucket keys integral (ms < 2^53, no "b:1e+15").
MAX_DELAY_MS = 366 * 86_400_000
MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z, the Timestamp maximum
MIN_LEASE_MS, MAX_LEASE_MS = 1_000, 12 * 3_600_000
MAX_HEADERS, MAX_HEADER_KEY, MAX_HEADER_VALUE = 64, 256, 8192
MAX_IDEMPOTENCY_KEY = 256
MAX_REASON = 4096
MAX_BATCH = 1000
MAX_TOKENS = 1000
MAX_QUEUES = 16
MAX_OUTSTANDING = 10_000
MAX_ATTEMPTS = 1000
# Bytes that the server may add to a delivery beyond what validation bounds here:
# trace headers copied from the caller's gRPC metadata (at most the server's 8 KiB
# metadata limit), and ids, names, the token, timestamps and field framing.
TRACE_METADATA_BYTES = 8192
FIXED_DELIVERY_BYTES = 4096


def max_delivery_bytes(max_payload_bytes: int) -> int:
    """Upper bound on one serialized Delivery (and its framing in a ConsumeResponse).

    Payload + 64 headers of at most 256 + 8192 UTF-8 bytes (each map entry adds
    at most 10 bytes of tags and lengths) + trace headers + last_error (a nack
    reason) + fixed fields. With the 256 KiB default payload: 262,144 + 541,312
    + 8,192 + 4,099 + 4,096 = 819,843 bytes, under the 1 MiB message cap.
    """
    headers = MAX_HEADERS * (MAX_HEADER_KEY + MAX_HEADER_VALUE + 10)
    return (
        max_payload_bytes + headers + TRACE_METADATA_BYTES + MAX_REASON + 3 + FIXED_DELIVERY_BYTES
    )


# Names already accepted: a batch names its queue a thousand times (issue 12 profile).
# Bounded: cleared when full, so hostile callers cannot grow it.
_GOOD_NAMES: set[str] = set()
_GOOD_NAMES_MAX = 4096
# Control characters, refused in idempotency keys.
_CONTROL = re.compile(r"[\x00-\x1f]")


def name(field: str, value: str, *, default: str | None = None) -> str:
    """A namespace or queue name; braces, colons and slashes can never pass."""
    if value in _GOOD_NAMES:
        return value
    if not value and default is not None:
        return default
    if not value:
        raise InvalidArgument(field, "required")
    if len(_GOOD_NAMES) >= _GOOD_NAMES_MAX:
        _GOOD_NAMES.clear()
    if NAME_RE.match(value):
        _GOOD_NAMES.add(value)
    else:
        raise InvalidArgument(
            field,
            f"{value[:80]!r} is not a valid name: use 1-64 of A-Z a-z 0-9 _ . -, "
            "starting with a letter or digit",
        )
    return value


def namespace(value: str) -> str:
    return name("namespace", value, default="default")


def duration_ms(field: str, d: duration_pb2.Duration, *, lo: int, hi: int) -> int:
    if d.seconds < 0 or d.nanos < 0:
        raise InvalidArgument(field, "must not be negative")
    if d.nanos >= 1_000_000_000:
        raise InvalidArgument(field, "nanos must be below 1e9")
    ms = d.seconds * 1000 + d.nanos // 1_000_000
    if ms < lo or ms > hi:
        raise InvalidArgument(field, f"must be between {lo} ms and {hi} ms, got {ms} ms")
    return ms


def timestamp_ms(field: str, t: timestamp_pb2.Timestamp) -> int:
    if t.nanos < 0 or t.nanos >= 1_000_000_000:
        raise InvalidArgument(field, "nanos must be 0 to 999999999")
    if t.seconds < 0:
        raise InvalidArgument(field, "must be after 1970-01-01")
    if t.seconds > MAX_TIMESTAMP_S:
        raise InvalidArgument(
            field, f"must be at most 366 days after now; {t.seconds} s is past the year 9999"
        )
    return t.seconds * 1000 + t.nanos // 1_000_000


def job_id(value: str) -> int:
    """Checks a job id's form; returns the shard it names."""
    shard = ids.shard_of(value)
    if shard is None:
        raise InvalidArgument("job_id", f"{value[:80]!r} is not a delayq job id")
    return shard


@dataclass(slots=True)  # not frozen: a frozen __init__ costs 3x (one per batch item)
class EnqueueInput:
    """A validated job and where it goes; the store assigns ``spec.job_id``."""

    namespace: str
    queue: str
    spec: JobSpec
    # The request left these to defaults: the queue's own settings may fill them
    # (UpdateQueue, issue 14; service.py applies them).
    default_attempts: bool = False
    default_retry: bool = False


def enqueue(req: service_pb2.EnqueueRequest, cfg: Config) -> EnqueueInput:
    """Validates one job. Refusals name the field; EnqueueBatch puts the item's
    place (``requests[3].``) in front of the message."""
    # Each field read from a protobuf message makes a new Python object (the
    # payload a new bytes copy): read each once. The common case (names seen
    # before, a delay in range, no TTL, no retry policy) takes the fewest reads
    # and calls; messages are only built on a refusal (issue 12 profile:
    # validation was a third of a batch's server time).
    ns = req.namespace
    if ns not in _GOOD_NAMES:
        ns = name("namespace", ns, default="default")
    queue = req.queue
    if queue not in _GOOD_NAMES:
        queue = name("queue", queue)
    payload = req.payload
    if not payload:
        raise InvalidArgument("payload", "must not be empty")
    if len(payload) > cfg.max_payload_bytes:
        raise InvalidArgument(
            "payload", f"{len(payload)} bytes is over the {cfg.max_payload_bytes}-byte limit"
        )
    header_map = req.headers
    headers = _headers(dict(header_map)) if len(header_map) else {}
    delay_ms: int | None = None
    due_at_ms: int | None = None
    which = req.WhichOneof("schedule")
    if which == "delay":
        d = req.delay
        seconds, nanos = d.seconds, d.nanos
        delay_ms = seconds * 1000 + nanos // 1_000_000
        if not (seconds >= 0 and 0 <= nanos < 1_000_000_000 and delay_ms <= MAX_DELAY_MS):
            duration_ms("delay", d, lo=0, hi=MAX_DELAY_MS)  # raises, naming the problem
    elif which == "due_time":
        t = req.due_time
        seconds, nanos = t.seconds, t.nanos
        if 0 <= seconds <= MAX_TIMESTAMP_S and 0 <= nanos < 1_000_000_000:
            due_at_ms = seconds * 1000 + nanos // 1_000_000
        else:  # the refusal, naming the field
            due_at_ms = timestamp_ms("due_time", t)
    else:
        delay_ms = 0
    ttl_ms = 0
    if req.HasField("ttl"):
        ttl_ms = duration_ms("ttl", req.ttl, lo=1, hi=10 * MAX_DELAY_MS)
        if delay_ms is not None and ttl_ms <= delay_ms:
            raise InvalidArgument(
                "ttl",
                f"{ttl_ms} ms must be longer than the delay ({delay_ms} ms): "
                "the job would expire before it is due",
            )
    asked_attempts = req.max_attempts
    max_attempts = asked_attempts or cfg.default_max_attempts
    if not 1 <= max_attempts <= MAX_ATTEMPTS:
        raise InvalidArgument("max_attempts", f"must be 1 to {MAX_ATTEMPTS}")
    has_retry = req.HasField("retry")
    if has_retry:
        initial, cap, mult, jitter = retry(req.retry, cfg, "retry.")
    else:  # the server's defaults, checked at start-up (config.check)
        initial, cap = cfg.retry_initial_ms, cfg.retry_max_ms
        mult, jitter = cfg.retry_multiplier, cfg.retry_jitter
    key = req.idempotency_key
    if key:
        if len(key) > MAX_IDEMPOTENCY_KEY:
            raise InvalidArgument("idempotency_key", f"at most {MAX_IDEMPOTENCY_KEY} chars")
        if _CONTROL.search(key):
            raise InvalidArgument("idempotency_key", "control characters are not allowed")
    return EnqueueInput(
        ns,
        queue,
        JobSpec(
            "",
            payload,
            headers,
            delay_ms,
            due_at_ms,
            ttl_ms,
            max_attempts,
            initial,
            cap,
            mult,
            jitter,
            key,
        ),
        asked_attempts == 0,
        not has_retry,
    )


def _headers(headers: dict[str, str]) -> dict[str, str]:
    """Job headers, bounded in count and in UTF-8 bytes: that bounds the delivery
    size (max_delivery_bytes)."""
    if len(headers) > MAX_HEADERS:
        raise InvalidArgument("headers", f"at most {MAX_HEADERS} entries")
    for k, v in headers.items():
        if not k or len(k.encode()) > MAX_HEADER_KEY:
            raise InvalidArgument("headers", f"keys must be 1-{MAX_HEADER_KEY} bytes (UTF-8)")
        if len(v.encode()) > MAX_HEADER_VALUE:
            raise InvalidArgument(
                f"headers[{k[:80]!r}]", f"value over {MAX_HEADER_VALUE} bytes (UTF-8)"
            )
    return headers


def due_vs_now(spec: JobSpec, now_ms: int, prefix: str = "") -> InvalidArgument | None:
    """The refusal for an absolute due time the clock puts out of bounds, if any:
    past the 366-day horizon, or after the job's TTL ends."""
    if spec.due_at_ms is None:
        return None
    if spec.due_at_ms > now_ms + MAX_DELAY_MS:
        days = (spec.due_at_ms - now_ms) / 86_400_000
        return InvalidArgument(
            prefix + "due_time",
            f"must be at most 366 days after now (the server clock), got {days:.1f} days",
        )
    if spec.ttl_ms and now_ms + spec.ttl_ms <= spec.due_at_ms:
        return InvalidArgument(
            prefix + "ttl",
            "must be longer than the time until due_time: the job would expire first",
        )
    return None


def retry(
    policy: job_pb2.RetryPolicy, cfg: Config, prefix: str, *, has_policy: bool = True
) -> tuple[int, int, float, float]:
    initial = cfg.retry_initial_ms
    if policy.HasField("initial_backoff"):
        initial = duration_ms(
            prefix + "initial_backoff", policy.initial_backoff, lo=0, hi=MAX_DELAY_MS
        )
    cap = max(cfg.retry_max_ms, initial)
    if policy.HasField("max_backoff"):
        cap = duration_ms(prefix + "max_backoff", policy.max_backoff, lo=0, hi=MAX_DELAY_MS)
        if cap < initial:
            raise InvalidArgument(prefix + "max_backoff", "must not be below initial_backoff")
    mult = policy.multiplier or cfg.retry_multiplier
    if not 1.0 <= mult <= 10.0:
        raise InvalidArgument(prefix + "multiplier", "must be 1.0 to 10.0 (0 = server default)")
    # A job without a retry policy gets the server's --retry-jitter; a policy
    # given is taken as it is (its jitter 0 means none).
    jitter = policy.jitter if has_policy else cfg.retry_jitter
    if not 0.0 <= jitter <= 1.0:
        raise InvalidArgument(prefix + "jitter", "must be 0.0 to 1.0")
    return initial, cap, mult, jitter


@dataclass(frozen=True, slots=True)
class ConsumeInput:
    namespace: str
    queues: list[str]
    max_outstanding: int
    lease_ms: int
    max_batch: int
    release_grace_ms: int
    default_lease: bool = False  # no lease_duration given: a queue's default may apply


def consume(req: service_pb2.ConsumeRequest, cfg: Config) -> ConsumeInput:
    ns = namespace(req.namespace)
    if not req.queues:
        raise InvalidArgument("queues", "name at least one queue")
    if len(req.queues) > MAX_QUEUES:
        raise InvalidArgument("queues", f"at most {MAX_QUEUES} queues per stream")
    queues = [name(f"queues[{i}]", q) for i, q in enumerate(req.queues)]
    if len(set(queues)) != len(queues):
        raise InvalidArgument("queues", "a queue is named twice")
    if not 1 <= req.max_outstanding <= MAX_OUTSTANDING:
        raise InvalidArgument(
            "max_outstanding", f"must be 1 to {MAX_OUTSTANDING}, got {req.max_outstanding}"
        )
    lease = cfg.default_lease_ms
    if req.HasField("lease_duration"):
        lease = duration_ms("lease_duration", req.lease_duration, lo=MIN_LEASE_MS, hi=MAX_LEASE_MS)
    if req.max_batch > 1000:
        raise InvalidArgument("max_batch", "must be 0 to 1000")
    max_batch = min(req.max_batch or req.max_outstanding, req.max_outstanding)
    grace = 0
    if req.HasField("release_grace"):
        # Bounded by the lease: a longer grace would outlive the lease it protects.
        grace = duration_ms("release_grace", req.release_grace, lo=0, hi=lease)
    return ConsumeInput(
        ns,
        queues,
        req.max_outstanding,
        lease,
        max_batch,
        grace,
        default_lease=not req.HasField("lease_duration"),
    )


def token(field: str, value: str) -> ids.LeaseToken:
    parsed = ids.parse_token(value)
    if parsed is None:
        raise InvalidArgument(field, f"{value[:120]!r} is not a lease token from a delivery")
    return parsed


def tokens(values: list[str]) -> list[ids.LeaseToken]:
    if not values:
        raise InvalidArgument("lease_tokens", "give at least one token")
    if len(values) > MAX_TOKENS:
        raise InvalidArgument("lease_tokens", f"at most {MAX_TOKENS} per call")
    return [token(f"lease_tokens[{i}]", v) for i, v in enumerate(values)]


def nack_delay(req: service_pb2.NackRequest) -> int | None:
    if len(req.reason.encode()) > MAX_REASON:
        raise InvalidArgument("reason", f"at most {MAX_REASON} bytes")
    if req.HasField("delay"):
        if req.dead_letter:
            raise InvalidArgument("delay", "cannot be combined with dead_letter")
        return duration_ms("delay", req.delay, lo=0, hi=MAX_DELAY_MS)
    return None


def extension(req: service_pb2.ExtendLeaseRequest) -> int:
    if not req.HasField("extension"):
        raise InvalidArgument("extension", "required (1 s to 12 h)")
    return duration_ms("extension", req.extension, lo=MIN_LEASE_MS, hi=MAX_LEASE_MS)


_PAGE_TOKEN_RE = re.compile(r"^(\d{1,6}):(\d{1,12})$")


def dead_page_token(value: str, shards: int) -> tuple[int, int]:
    """A ListDeadJobs page token ("<shard>:<offset>") checked against the queue;
    anything else would silently end or restart the paging."""
    if not value:
        return 0, 0
    m = _PAGE_TOKEN_RE.match(value)
    if m is None or int(m.group(1)) >= shards:
        raise InvalidArgument(
            "page_token", "not a token from ListDeadJobs for this queue; start with an empty one"
        )
    return int(m.group(1)), int(m.group(2))


def limit(field: str, value: int, *, default: int, hi: int) -> int:
    if value == 0:
        return default
    if value > hi:
        raise InvalidArgument(field, f"must be 0 to {hi}")
    return value
