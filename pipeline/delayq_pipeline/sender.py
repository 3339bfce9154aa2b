"""Runs on the executors: one channel per partition, EnqueueBatch with bounded calls in flight."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc

from delayq._backoff import Backoff
from delayq._channel import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, channel_options
from delayq.v1 import service_pb2, service_pb2_grpc

__all__ = ["ClientSettings", "Item", "OutRecord", "send_partition"]

# Whole-call and per-item codes worth another try: the server is restarting or
# shedding load (Redis out of memory, a quota). Every request carries an
# idempotency key, so a repeat never stores a job twice.
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})
_RETRYABLE_INTS = frozenset(c.value[0] for c in RETRYABLE_CODES)
_CODE_NAMES = {c.value[0]: c.name for c in grpc.StatusCode}


@dataclass(frozen=True)
class ClientSettings:
    """How executors reach delayq; pickled into every task, so plain data only."""

    target: str = "127.0.0.1:50051"  # several, comma-separated: partitions spread over them
    namespace: str = "default"
    token: str | None = None  # sent as `authorization: Bearer <token>`
    tls: bool = False
    ca_pem: bytes | None = None  # None with tls: the system roots
    server_name: str | None = None  # TLS name override (tests with a self-signed cert)
    batch_size: int = 500
    in_flight: int = 4
    timeout: float = 30.0
    max_attempts: int = 0  # 0: the server's default
    retry_deadline: float = 120.0
    backoff: Backoff = field(default_factory=lambda: Backoff(initial=0.05, maximum=5.0))

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= MAX_BATCH_ITEMS:
            raise ValueError(f"batch_size must be 1 to {MAX_BATCH_ITEMS}")
        if self.in_flight < 1:
            raise ValueError("in_flight must be at least 1")

    def channel(self, partition: int = 0) -> grpc.Channel:
        """A channel to one of the targets: partition i uses target i mod n, so the
        load of a big job spreads over stateless server replicas."""
        targets = [t.strip() for t in self.target.split(",") if t.strip()]
        target = targets[partition % len(targets)]
        opts: list[tuple[str, Any]] = []
        if self.server_name:
            opts.append(("grpc.ssl_target_name_override", self.server_name))
        options = channel_options(opts)
        if self.tls or self.ca_pem is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.ca_pem)
            return grpc.secure_channel(target, creds, options=options)
        return grpc.insecure_channel(target, options=options)

    def unreachable(self, timeout: float = 10.0) -> str | None:
        """What stops the driver reaching each target within `timeout` (TLS included),
        or None: a wrong address fails in seconds instead of after the retry deadline."""
        targets = [t.strip() for t in self.target.split(",") if t.strip()]
        for i, target in enumerate(targets):
            channel = self.channel(i)
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                return (
                    f"cannot reach the server at {target} within {timeout:g} s "
                    "(give --target or DELAYQ_ADDR: the address the server printed on start)"
                )
            finally:
                channel.close()
        return None

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


class Item(NamedTuple):
    """One prepared row (see prepare.py); `reject` set means: do not send, report."""

    queue: str | None
    payload: bytes | None
    due_ms: int | None
    delay_ms: int | None
    key: str
    headers: dict[str, str] | None
    reject: str | None
    row: str | None


class OutRecord(NamedTuple):
    """What a partition reports: one `stats` record, plus one `reject` per refused row."""

    kind: str  # "stats" | "reject"
    key: str | None
    queue: str | None
    reason: str | None
    stage: str | None  # "input" (refused before sending) | "server"
    row: str | None  # the input row as JSON (input rejects; server ones are joined later)
    rows: int
    enqueued: int
    duplicates: int
    retries: int


OUT_FIELDS = OutRecord._fields


@dataclass
class _Tally:
    rows: int = 0
    enqueued: int = 0
    duplicates: int = 0
    retries: int = 0
    rejects: list[OutRecord] = field(default_factory=list)

    def reject(self, item: Item, reason: str, stage: str, row: str | None = None) -> None:
        self.rejects.append(
            OutRecord("reject", item.key, item.queue, reason, stage, row, 0, 0, 0, 0)
        )


def _request(item: Item, s: ClientSettings) -> service_pb2.EnqueueRequest:
    # One constructor call with nested fields as dicts: cheaper per row than
    # building Timestamp/Duration messages and copying them in.
    fields: dict[str, Any] = {
        "namespace": s.namespace,
        "queue": item.queue or "",
        "payload": item.payload or b"",
        "idempotency_key": item.key,
        "max_attempts": s.max_attempts,
    }
    if item.headers:
        fields["headers"] = item.headers
    if item.due_ms is not None:
        fields["due_time"] = {"seconds": item.due_ms // 1000, "nanos": item.due_ms % 1000 * 10**6}
    else:
        # A delay counts from the server's (Redis) clock, never this executor's.
        ms = item.delay_ms or 0
        fields["delay"] = {"seconds": ms // 1000, "nanos": ms % 1000 * 10**6}
    return service_pb2.EnqueueRequest(**fields)


def _batches(
    items: Iterable[Item], s: ClientSettings, tally: _Tally
) -> Iterator[list[tuple[Item, service_pb2.EnqueueRequest]]]:
    """Sendable rows in batches bounded by count and encoded size; refused rows go to tally."""
    batch: list[tuple[Item, service_pb2.EnqueueRequest]] = []
    size = 0
    for item in items:
        tally.rows += 1
        if item.reject is not None:
            tally.reject(item, item.reject, "input", item.row)
            continue
        req = _request(item, s)
        req_size = req.ByteSize() + 8
        if batch and (len(batch) >= s.batch_size or size + req_size > MAX_BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append((item, req))
        size += req_size
    if batch:
        yield batch


class _Sender:
    def __init__(self, s: ClientSettings, channel: grpc.Channel, tally: _Tally) -> None:
        self.s = s
        self.tally = tally
        self.stub = service_pb2_grpc.DelayQueueServiceStub(channel)
        self.metadata = s.metadata()

    def submit(self, batch: Sequence[tuple[Item, service_pb2.EnqueueRequest]]) -> Any:
        request = service_pb2.EnqueueBatchRequest(requests=[r for _, r in batch])
        return self.stub.EnqueueBatch.future(
            request, timeout=self.s.timeout, metadata=self.metadata
        )

    def settle(self, batch: list[tuple[Item, service_pb2.EnqueueRequest]], future: Any) -> None:
        """Waits for one call; retries what the server could not take yet, with backoff."""
        started = time.monotonic()
        attempt = 0
        while batch:
            try:
                response = future.result()
            except grpc.RpcError as exc:
                code = exc.code()
                if code not in RETRYABLE_CODES:
                    # UNAUTHENTICATED, PERMISSION_DENIED, a malformed batch...: a setting
                    # is wrong for every row, so the job fails loudly instead of
                    # rejecting the whole dataset row by row.
                    raise RuntimeError(
                        f"EnqueueBatch failed: {code.name}: {exc.details()}"
                    ) from None
                retry = batch
            else:
                retry = self._results(batch, response)
            if not retry:
                return
            wait = self.s.backoff.delay(attempt)
            if time.monotonic() - started + wait > self.s.retry_deadline:
                raise RuntimeError(
                    f"EnqueueBatch still refused after {self.s.retry_deadline:.0f} s "
                    f"({len(retry)} jobs left)"
                )
            self.tally.retries += 1
            time.sleep(wait)
            attempt += 1
            batch = retry
            future = self.submit(batch)

    def _results(
        self,
        batch: list[tuple[Item, service_pb2.EnqueueRequest]],
        response: service_pb2.EnqueueBatchResponse,
    ) -> list[tuple[Item, service_pb2.EnqueueRequest]]:
        retry = []
        for (item, req), result in zip(batch, response.results, strict=True):
            if result.HasField("error") and result.error.code != 0:
                if result.error.code in _RETRYABLE_INTS:
                    retry.append((item, req))
                else:
                    name = _CODE_NAMES.get(result.error.code, str(result.error.code))
                    self.tally.reject(item, f"{name}: {result.error.message}", "server")
            elif result.response.duplicate:
                self.tally.duplicates += 1
            else:
                self.tally.enqueued += 1
        return retry


def send_partition(
    items: Iterable[Item], s: ClientSettings, partition: int = 0
) -> Iterator[OutRecord]:
    """Sends one partition's rows; yields its rejects, then one stats record.

    At most `s.in_flight` EnqueueBatch calls are outstanding on the partition's
    channel: enough to hide the round trip, bounded so a partition cannot flood
    the server (each call holds up to `batch_size` jobs).
    """
    tally = _Tally()
    with s.channel(partition) as channel:
        sender = _Sender(s, channel, tally)
        pending: deque[tuple[list[tuple[Item, service_pb2.EnqueueRequest]], Any]] = deque()
        for batch in _batches(items, s, tally):
            while len(pending) >= s.in_flight:
                sender.settle(*pending.popleft())
            pending.append((batch, sender.submit(batch)))
        while pending:
            sender.settle(*pending.popleft())
    yield from tally.rejects
    yield OutRecord(
        "stats",
        None,
        None,
        None,
        None,
        None,
        tally.rows,
        tally.enqueued,
        tally.duplicates,
        tally.retries,
    )
