"""Recent delivery lateness per queue on this process, for the dashboard's p99 sparkline.

Every Consume delivery records its lateness (Redis-clock claim time minus due
time, plus the wait until the stream write) here, telemetry on or off. The
window is this process's view: with several replicas each dashboard shows the
deliveries its own server wrote (docs/decisions.md, issue 14).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

WINDOW_S = 60.0
MAX_SAMPLES = 4096  # per queue: the newest ones count
MAX_QUEUES = 1024  # least recently delivered queues are forgotten first


class LatenessWindow:
    """Lateness samples (ms) of the last WINDOW_S seconds, per (namespace, queue)."""

    def __init__(self) -> None:
        self._queues: OrderedDict[tuple[str, str], deque[tuple[float, float]]] = OrderedDict()

    def record(
        self, namespace: str, queue: str, lateness_ms: float, now: float | None = None
    ) -> None:
        key = (namespace, queue)
        samples = self._queues.get(key)
        if samples is None:
            if len(self._queues) >= MAX_QUEUES:
                self._queues.popitem(last=False)
            samples = self._queues[key] = deque(maxlen=MAX_SAMPLES)
        else:
            self._queues.move_to_end(key)
        samples.append((time.monotonic() if now is None else now, lateness_ms))

    def p99(self, namespace: str, queue: str, now: float | None = None) -> float | None:
        """The 99th percentile (nearest rank) of the window, None without deliveries."""
        samples = self._queues.get((namespace, queue))
        if not samples:
            return None
        since = (time.monotonic() if now is None else now) - WINDOW_S
        while samples and samples[0][0] < since:
            samples.popleft()
        if not samples:
            return None
        values = sorted(v for _, v in samples)
        rank = max(0, -(-99 * len(values) // 100) - 1)
        return values[rank]


WINDOW = LatenessWindow()  # one per process: the dashboard and Consume share it
