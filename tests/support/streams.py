"""A Consume stream without gRPC: a real Dispatcher and ConsumeStream on the real store,
with the stream module's monotonic clock under the test's control (scripts take an
explicit now the same way), so a lease runs out without waiting for it."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from delayq_server import events
from delayq_server.dispatcher import Dispatcher
from delayq_server.store import Claimed, LeaseRef, ShardKeys, Store
from delayq_server.stream import ConsumeStream

Batch = list[tuple[ShardKeys, Claimed]]


class StreamClock:
    """Stands in for stream.py's `time` module; the test moves `now`."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now


@dataclass
class Streams:
    """Opens streams of one Dispatcher ("srv") and closes them at the end."""

    store: Store
    clock: StreamClock
    dispatcher: Dispatcher = field(init=False)
    _open: list[AsyncGenerator[Batch]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dispatcher = Dispatcher(self.store, events.EventHub(), "srv")

    def open(
        self, keys: ShardKeys, *, slots: int, lease_ms: int = 60_000
    ) -> tuple[ConsumeStream, AsyncGenerator[Batch]]:
        stream = self.dispatcher.open([[keys]], slots, lease_ms, max_batch=slots)
        deliveries = stream.deliveries()
        assert isinstance(deliveries, AsyncGenerator)
        self._open.append(deliveries)
        return stream, deliveries

    async def run_out(
        self, stream: ConsumeStream, keys: ShardKeys, claimed: Claimed
    ) -> list[LeaseRef]:
        """Time passes beyond the lease's deadline, on the stream's clock and Redis'
        alike; the reaper takes every lease of the shard due by then."""
        self.clock.now = max(
            self.clock.now, stream.outstanding[claimed.nonce].may_expire_at + 0.001
        )
        return (await self.store.reap(keys, now_ms=claimed.lease_deadline_ms + 1)).reaped

    async def close(self) -> None:
        for deliveries in self._open:
            await deliveries.aclose()
