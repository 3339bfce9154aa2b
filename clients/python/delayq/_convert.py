"""Conversions between Python values and delayq.v1 messages, shared by both clients."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from delayq.models import (
    Delivery,
    EnqueueResult,
    Job,
    JobState,
    Message,
    QueueStats,
    RetryPolicy,
)
from delayq.serializers import CONTENT_TYPE_HEADER, Serializer, decode_payload, encode_payload
from delayq.v1 import job_pb2, service_pb2

DurationLike = timedelta | float | int

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_timedelta(value: DurationLike) -> timedelta:
    """Accept a timedelta or a number of seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected timedelta or seconds, got {type(value).__name__}")
    return timedelta(seconds=value)


def to_duration(value: DurationLike) -> duration_pb2.Duration:
    """timedelta (or seconds) -> google.protobuf.Duration."""
    if type(value) is int:  # whole seconds (the usual delay): no timedelta, 4x cheaper
        return duration_pb2.Duration(seconds=value)
    # 3600.0 too; up to Duration's own bound (10,000 years), beyond it the timedelta path raises.
    if type(value) is float and value.is_integer() and abs(value) <= 315_576_000_000:
        return duration_pb2.Duration(seconds=int(value))
    td = to_timedelta(value)
    micros = (td.days * 86400 + td.seconds) * 1_000_000 + td.microseconds
    seconds, rem = divmod(abs(micros), 1_000_000)
    sign = -1 if micros < 0 else 1
    return duration_pb2.Duration(seconds=sign * seconds, nanos=sign * rem * 1000)


def from_duration(value: duration_pb2.Duration) -> timedelta:
    """google.protobuf.Duration -> timedelta (microsecond precision)."""
    return timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)


def to_timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    """datetime -> Timestamp. A naive datetime is local time, as datetime.timestamp() has it."""
    if not isinstance(value, datetime):
        raise TypeError(f"expected datetime, got {type(value).__name__}")
    aware = value if value.tzinfo is not None else value.astimezone()
    delta = aware - _EPOCH
    micros = (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds
    seconds, rem = divmod(micros, 1_000_000)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=rem * 1000)


def from_timestamp(value: timestamp_pb2.Timestamp) -> datetime:
    """Timestamp -> aware UTC datetime."""
    return _EPOCH + timedelta(seconds=value.seconds, microseconds=value.nanos // 1000)


def _opt_timestamp(msg: Any, name: str) -> datetime | None:
    return from_timestamp(getattr(msg, name)) if msg.HasField(name) else None


def parse_duration_text(text: str) -> timedelta:
    """Parse '250ms', '10s', '5m', '1h30m', '2d' or a bare number of seconds."""
    text = text.strip()
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"invalid duration {text!r} (use e.g. 250ms, 10s, 5m, 1h30m, 2d)")
    return timedelta(seconds=total)


def retry_to_proto(policy: RetryPolicy) -> job_pb2.RetryPolicy:
    """RetryPolicy -> delayq.v1.RetryPolicy."""
    msg = job_pb2.RetryPolicy(multiplier=policy.multiplier, jitter=policy.jitter)
    if policy.initial_backoff is not None:
        msg.initial_backoff.CopyFrom(to_duration(policy.initial_backoff))
    if policy.max_backoff is not None:
        msg.max_backoff.CopyFrom(to_duration(policy.max_backoff))
    return msg


def retry_from_proto(msg: job_pb2.RetryPolicy) -> RetryPolicy:
    """delayq.v1.RetryPolicy -> RetryPolicy."""
    return RetryPolicy(
        initial_backoff=(
            from_duration(msg.initial_backoff) if msg.HasField("initial_backoff") else None
        ),
        max_backoff=from_duration(msg.max_backoff) if msg.HasField("max_backoff") else None,
        multiplier=msg.multiplier,
        jitter=msg.jitter,
    )


def enqueue_request(
    namespace: str,
    queue: str,
    payload: Any,
    serializer: Serializer,
    *,
    delay: DurationLike | None = None,
    at: datetime | None = None,
    ttl: DurationLike | None = None,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
    headers: Mapping[str, str] | None = None,
    idempotency_key: str | None = None,
) -> service_pb2.EnqueueRequest:
    """Build one EnqueueRequest; `delay` and `at` are exclusive."""
    if delay is not None and at is not None:
        raise ValueError("give either delay or at, not both")
    data, content_type = encode_payload(payload, serializer)
    req = service_pb2.EnqueueRequest(namespace=namespace, queue=queue, payload=data)
    if headers:
        req.headers.update(headers)
    if content_type is not None and CONTENT_TYPE_HEADER not in req.headers:
        req.headers[CONTENT_TYPE_HEADER] = content_type
    if delay is not None:
        req.delay.CopyFrom(to_duration(delay))
    elif at is not None:
        req.due_time.CopyFrom(to_timestamp(at))
    if ttl is not None:
        req.ttl.CopyFrom(to_duration(ttl))
    if max_attempts is not None:
        req.max_attempts = max_attempts
    if retry is not None:
        req.retry.CopyFrom(retry_to_proto(retry))
    if idempotency_key:
        req.idempotency_key = idempotency_key
    return req


def batch_requests(
    namespace: str,
    queue: str,
    items: Iterable[Any],
    serializer: Serializer,
    defaults: Mapping[str, Any],
) -> list[service_pb2.EnqueueRequest]:
    """Build EnqueueRequests for enqueue_many; Message items override the call's options."""
    out = []
    for item in items:
        if isinstance(item, Message):
            opts = dict(defaults)
            for name in ("ttl", "max_attempts", "retry", "headers", "idempotency_key"):
                value = getattr(item, name)
                if value is not None:
                    opts[name] = value
            if item.delay is not None or item.at is not None:
                opts["delay"], opts["at"] = item.delay, item.at
            out.append(
                enqueue_request(namespace, item.queue or queue, item.payload, serializer, **opts)
            )
        else:
            out.append(enqueue_request(namespace, queue, item, serializer, **defaults))
    return out


def enqueue_result(msg: service_pb2.EnqueueResponse) -> EnqueueResult:
    """EnqueueResponse -> EnqueueResult."""
    return EnqueueResult(
        job_id=msg.job_id, due_time=_opt_timestamp(msg, "due_time"), duplicate=msg.duplicate
    )


def job_from_proto(msg: job_pb2.Job, serializer: Serializer) -> Job:
    """delayq.v1.Job -> Job, decoding the payload lazily with `serializer`."""
    return Job(
        id=msg.id,
        namespace=msg.namespace,
        queue=msg.queue,
        state=JobState(msg.state) if msg.state in JobState._value2member_map_ else JobState(0),
        data=msg.payload,
        headers=dict(msg.headers),
        attempts=msg.attempts,
        max_attempts=msg.max_attempts,
        retry=retry_from_proto(msg.retry) if msg.HasField("retry") else None,
        create_time=_opt_timestamp(msg, "create_time"),
        due_time=_opt_timestamp(msg, "due_time"),
        expire_time=_opt_timestamp(msg, "expire_time"),
        last_delivery_time=_opt_timestamp(msg, "last_delivery_time"),
        finish_time=_opt_timestamp(msg, "finish_time"),
        last_error=msg.last_error,
        _decode=lambda data, headers: decode_payload(data, headers, serializer),
    )


def delivery_from_proto(msg: job_pb2.Delivery, serializer: Serializer) -> Delivery:
    """delayq.v1.Delivery -> Delivery."""
    return Delivery(
        job=job_from_proto(msg.job, serializer),
        lease_token=msg.lease_token,
        attempt=msg.attempt,
        lease_deadline=_opt_timestamp(msg, "lease_deadline"),
    )


def stats_from_proto(msg: job_pb2.QueueStats) -> QueueStats:
    """delayq.v1.QueueStats -> QueueStats."""
    return QueueStats(
        namespace=msg.namespace,
        queue=msg.queue,
        scheduled=msg.scheduled,
        ready=msg.ready,
        leased=msg.leased,
        dead=msg.dead,
        completed=msg.completed,
        oldest_ready_age=from_duration(msg.oldest_ready_age),
        next_due_time=_opt_timestamp(msg, "next_due_time"),
        shards=msg.shards,
        enqueued_total=msg.enqueued_total,
        acked_total=msg.acked_total,
        retried_total=msg.retried_total,
        dead_lettered_total=msg.dead_lettered_total,
        expired_total=msg.expired_total,
    )


def consume_request(
    namespace: str,
    queues: Sequence[str],
    max_outstanding: int,
    lease: DurationLike | None,
    max_batch: int,
    release_grace: DurationLike | None,
) -> service_pb2.ConsumeRequest:
    """The ConsumeRequest of Client.consume, AsyncClient.consume_call and the Worker."""
    req = service_pb2.ConsumeRequest(
        namespace=namespace,
        queues=list(queues),
        max_outstanding=max_outstanding,
        max_batch=max_batch,
    )
    if lease is not None:
        req.lease_duration.CopyFrom(to_duration(lease))
    if release_grace is not None:
        req.release_grace.CopyFrom(to_duration(release_grace))
    return req
