"""Pure conversions between store records and protobuf messages."""

from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2

from delayq.v1 import job_pb2
from delayq_server.store import JobRecord, ShardKeys


def ts(ms: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def dur(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def job(keys: ShardKeys, job_id: str, rec: JobRecord, now_ms: int) -> job_pb2.Job:
    """A Job message; READY is derived for due jobs the promoter has not touched."""
    msg = job_pb2.Job(
        id=job_id,
        namespace=keys.namespace,
        queue=keys.queue,
        state=int(rec.state_at(now_ms)),  # type: ignore[arg-type]
        payload=rec.payload,
        headers=rec.headers,
        attempts=rec.attempts,
        max_attempts=rec.max_attempts,
        retry=job_pb2.RetryPolicy(
            initial_backoff=dur(rec.backoff_initial_ms),
            max_backoff=dur(rec.backoff_max_ms),
            multiplier=rec.multiplier,
            jitter=rec.jitter,
        ),
        create_time=ts(rec.created_ms),
        due_time=ts(rec.due_ms),
        last_error=rec.last_error,
    )
    if rec.expire_ms:
        msg.expire_time.CopyFrom(ts(rec.expire_ms))
    if rec.last_delivery_ms:
        msg.last_delivery_time.CopyFrom(ts(rec.last_delivery_ms))
    if rec.finish_ms:
        msg.finish_time.CopyFrom(ts(rec.finish_ms))
    return msg
