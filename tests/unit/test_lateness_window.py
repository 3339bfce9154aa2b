"""The dashboard's lateness window: p99 by nearest rank over the last minute, bounded."""

from __future__ import annotations

from delayq_server import lateness
from delayq_server.lateness import LatenessWindow


def test_p99_is_the_nearest_rank_of_the_last_minute() -> None:
    w = LatenessWindow()
    assert w.p99("ns", "q") is None
    for i in range(1, 101):  # 1..100 ms at t=0
        w.record("ns", "q", float(i), now=0.0)
    assert w.p99("ns", "q", now=1.0) == 99.0
    w.record("ns", "q", 500.0, now=30.0)
    assert w.p99("ns", "q", now=30.0) == 100.0  # 101 samples: rank 100
    # A minute later the first hundred are gone; only the 500 ms one is left.
    assert w.p99("ns", "q", now=61.0) == 500.0
    assert w.p99("ns", "q", now=91.0) is None
    assert w.p99("ns", "other", now=0.0) is None


def test_queues_and_samples_are_bounded() -> None:
    w = LatenessWindow()
    for i in range(lateness.MAX_QUEUES + 5):
        w.record("ns", f"q{i}", 1.0, now=0.0)
    assert w.p99("ns", "q0", now=0.0) is None  # the least recently delivered went first
    assert w.p99("ns", f"q{lateness.MAX_QUEUES + 4}", now=0.0) == 1.0
    for i in range(lateness.MAX_SAMPLES + 10):
        w.record("ns", "busy", 1000.0 if i < 10 else 1.0, now=0.0)
    assert w.p99("ns", "busy", now=0.0) == 1.0  # the ten oldest samples fell out
