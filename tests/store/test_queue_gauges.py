"""queue_gauges.py: bounded refreshes that still cover every queue in turn."""

from __future__ import annotations

import pytest

from delayq_server import queue_gauges
from delayq_server.queue_gauges import QueueGauges
from delayq_server.store import ShardKeys, Store
from delayq_server.telemetry import Telemetry
from tests.support.seed import Shard


async def test_queues_past_the_shard_budget_are_read_in_turn(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_gauges, "MAX_SHARDS", 2)
    names = ["a", "b", "c"]  # one shard each: two fit in a refresh
    for i, name in enumerate(names):
        shard = Shard(store, ShardKeys("default", name, 0))
        for _ in range(i + 1):
            await shard.scheduled(90_000)
    known = [("default", n, 1) for n in names]
    gauges = QueueGauges(store, Telemetry(), lambda: known, lambda: 0, lambda: 0)
    await gauges.refresh()
    assert set(gauges.snapshot) == {("default", "a"), ("default", "b")}
    await gauges.refresh()  # c, then a again; b keeps its last values
    assert {q: s.states["scheduled"] for (_, q), s in gauges.snapshot.items()} == {
        "a": 1,
        "b": 2,
        "c": 3,
    }
    assert gauges.snapshot[("default", "c")].due.later == 3  # seeded at T0, months ahead
    known.pop()  # a queue that is gone leaves the snapshot
    await gauges.refresh()
    assert set(gauges.snapshot) == {("default", "a"), ("default", "b")}
