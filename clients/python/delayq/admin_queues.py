"""Queue administration on AdminService (issue 14): the methods AdminClient mixes in."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import grpc
from google.protobuf import field_mask_pb2

from delayq import _convert
from delayq.errors import from_rpc_error
from delayq.models import Job, JobState, QueueStats, RetryPolicy
from delayq.serializers import JsonSerializer
from delayq.v1 import admin_pb2

__all__ = ["PurgeStep", "QueueAdminMixin", "QueueInfo", "QueueSettings", "RedriveStep"]

#: UpdateQueue's field names, as `update_queue` takes them.
SETTING_NAMES = (
    "default_lease",
    "max_attempts",
    "retry",
    "completed_retention",
    "dead_retention",
    "dead_max_jobs",
)


@dataclass(frozen=True)
class QueueSettings:
    """A queue's own settings; None / 0 means the server default."""

    shards: int = 0
    default_lease: timedelta | None = None
    max_attempts: int = 0
    retry: RetryPolicy | None = None
    completed_retention: timedelta | None = None
    dead_retention: timedelta | None = None
    dead_max_jobs: int = 0

    def to_proto(self) -> admin_pb2.QueueSettings:
        m = admin_pb2.QueueSettings(
            shards=self.shards, max_attempts=self.max_attempts, dead_max_jobs=self.dead_max_jobs
        )
        if self.default_lease is not None:
            m.default_lease.CopyFrom(_convert.to_duration(self.default_lease))
        if self.retry is not None:
            m.retry.CopyFrom(_convert.retry_to_proto(self.retry))
        if self.completed_retention is not None:
            m.completed_retention.CopyFrom(_convert.to_duration(self.completed_retention))
        if self.dead_retention is not None:
            m.dead_retention.CopyFrom(_convert.to_duration(self.dead_retention))
        return m

    @classmethod
    def from_proto(cls, m: admin_pb2.QueueSettings) -> QueueSettings:
        def dur(name: str) -> timedelta | None:
            return _convert.from_duration(getattr(m, name)) if m.HasField(name) else None  # type: ignore[arg-type]

        return cls(
            shards=m.shards,
            default_lease=dur("default_lease"),
            max_attempts=m.max_attempts,
            retry=_convert.retry_from_proto(m.retry) if m.HasField("retry") else None,
            completed_retention=dur("completed_retention"),
            dead_retention=dur("dead_retention"),
            dead_max_jobs=m.dead_max_jobs,
        )


@dataclass(frozen=True)
class QueueInfo:
    """A queue: settings, counts, paused flag."""

    namespace: str
    queue: str
    settings: QueueSettings
    stats: QueueStats
    paused: bool

    @classmethod
    def from_proto(cls, m: admin_pb2.Queue) -> QueueInfo:
        return cls(
            m.namespace,
            m.queue,
            QueueSettings.from_proto(m.settings),
            _convert.stats_from_proto(m.stats),
            m.paused,
        )


@dataclass(frozen=True)
class PurgeStep:
    purged: int
    remaining: int


@dataclass(frozen=True)
class RedriveStep:
    redriven: int
    remaining: int


class QueueAdminMixin:
    """Queue and job administration; AdminClient provides the stub and credentials."""

    _stub: Any
    _metadata: Sequence[tuple[str, str]] | None
    timeout: float
    namespace: str = ""

    def _call(self, rpc: str, req: Any, timeout: float | None = None) -> Any:
        try:
            return getattr(self._stub, rpc)(
                req, timeout=timeout or self.timeout, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    def list_queues(self, namespace: str = "") -> list[QueueInfo]:
        """Every queue the token may read (all pages), by namespace then name."""
        out: list[QueueInfo] = []
        token = ""
        while True:
            resp = self._call(
                "ListQueues",
                admin_pb2.ListQueuesRequest(namespace=namespace, page_size=500, page_token=token),
            )
            out += [QueueInfo.from_proto(q) for q in resp.queues]
            token = resp.next_page_token
            if not token:
                return out

    def create_queue(self, queue: str, settings: QueueSettings | None = None) -> QueueInfo:
        req = admin_pb2.CreateQueueRequest(
            namespace=self.namespace, queue=queue, settings=(settings or QueueSettings()).to_proto()
        )
        return QueueInfo.from_proto(self._call("CreateQueue", req).queue)

    def get_queue(self, queue: str) -> QueueInfo:
        req = admin_pb2.GetQueueRequest(namespace=self.namespace, queue=queue)
        return QueueInfo.from_proto(self._call("GetQueue", req).queue)

    def update_queue(self, queue: str, settings: QueueSettings, fields: Sequence[str]) -> QueueInfo:
        """Changes the named settings (SETTING_NAMES); a named one left unset resets."""
        req = admin_pb2.UpdateQueueRequest(
            namespace=self.namespace,
            queue=queue,
            settings=settings.to_proto(),
            update_mask=field_mask_pb2.FieldMask(paths=list(fields)),
        )
        return QueueInfo.from_proto(self._call("UpdateQueue", req).queue)

    def delete_queue(self, queue: str) -> None:
        self._call(
            "DeleteQueue", admin_pb2.DeleteQueueRequest(namespace=self.namespace, queue=queue)
        )

    def pause_queue(self, queue: str) -> QueueInfo:
        req = admin_pb2.PauseQueueRequest(namespace=self.namespace, queue=queue)
        return QueueInfo.from_proto(self._call("PauseQueue", req).queue)

    def resume_queue(self, queue: str) -> QueueInfo:
        req = admin_pb2.ResumeQueueRequest(namespace=self.namespace, queue=queue)
        return QueueInfo.from_proto(self._call("ResumeQueue", req).queue)

    def purge_step(
        self, queue: str, state: JobState | None = None, *, limit: int = 1000
    ) -> PurgeStep:
        """Deletes up to `limit` jobs (one state, or all); call again until remaining is 0."""
        req = admin_pb2.PurgeQueueRequest(
            namespace=self.namespace,
            queue=queue,
            state=int(state or 0),  # type: ignore[arg-type]
            limit=limit,
        )
        resp = self._call("PurgeQueue", req, timeout=max(self.timeout, 60))
        return PurgeStep(resp.purged, resp.remaining)

    def iter_jobs(
        self,
        queue: str,
        state: JobState,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        page_size: int = 100,
        preview_bytes: int = 256,
    ) -> Iterator[Job]:
        """Jobs of one state in order (payloads cut to `preview_bytes`)."""
        token = ""
        serializer = JsonSerializer()
        while True:
            req = admin_pb2.ListJobsRequest(
                namespace=self.namespace,
                queue=queue,
                state=int(state),  # type: ignore[arg-type]
                page_size=page_size,
                page_token=token,
                payload_preview_bytes=preview_bytes,
            )
            if start is not None:
                req.from_time.CopyFrom(_convert.to_timestamp(start))
            if end is not None:
                req.to_time.CopyFrom(_convert.to_timestamp(end))
            resp = self._call("ListJobs", req)
            for m in resp.jobs:
                yield _convert.job_from_proto(m, serializer)
            token = resp.next_page_token
            if not token:
                return

    def reschedule_job(
        self,
        queue: str,
        job_id: str,
        *,
        delay: timedelta | None = None,
        at: datetime | None = None,
        force: bool = False,
    ) -> Job:
        req = admin_pb2.RescheduleJobRequest(
            namespace=self.namespace, queue=queue, job_id=job_id, force=force
        )
        if at is not None:
            req.due_time.CopyFrom(_convert.to_timestamp(at))
        else:
            req.delay.CopyFrom(_convert.to_duration(delay or timedelta(0)))
        return _convert.job_from_proto(self._call("RescheduleJob", req).job, JsonSerializer())

    def update_job(
        self,
        queue: str,
        job_id: str,
        *,
        payload: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Job:
        paths = [p for p, v in (("payload", payload), ("headers", headers)) if v is not None]
        req = admin_pb2.UpdateJobRequest(
            namespace=self.namespace,
            queue=queue,
            job_id=job_id,
            payload=payload or b"",
            headers=dict(headers or {}),
            update_mask=field_mask_pb2.FieldMask(paths=paths),
        )
        return _convert.job_from_proto(self._call("UpdateJob", req).job, JsonSerializer())

    def redrive_step(
        self,
        queue: str,
        *,
        target: str = "",
        job_ids: Sequence[str] = (),
        limit: int = 1000,
        rate: int = 0,
    ) -> RedriveStep:
        """Moves up to `limit` dead jobs back to ready (to `target` when given), at
        most `rate` per second; call again until remaining is 0."""
        req = admin_pb2.RedriveDeadLettersRequest(
            namespace=self.namespace,
            queue=queue,
            target_queue=target,
            job_ids=list(job_ids),
            limit=limit,
            rate=rate,
        )
        wait = limit / rate if rate else 0
        resp = self._call("RedriveDeadLetters", req, timeout=max(self.timeout, 60) + wait)
        return RedriveStep(resp.redriven, resp.remaining)


def state_of(name: str) -> JobState:
    """A JobState from its name, any case ("dead", "SCHEDULED")."""
    try:
        return JobState[name.upper()]
    except KeyError:
        raise ValueError(
            f"unknown state {name!r}: scheduled, ready, leased, dead or completed"
        ) from None
