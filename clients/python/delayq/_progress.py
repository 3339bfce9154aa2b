"""A small progress bar for the command line (stderr, redrawn at most 10 times a second)."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """Counts done items against an optional total and draws a one-line bar."""

    def __init__(
        self, total: int | None, stream: TextIO, *, enabled: bool, label: str = "enqueued"
    ) -> None:
        self.total = total
        self.done = 0
        self._stream = stream
        self._enabled = enabled
        self._label = label
        self._started = time.monotonic()
        self._drawn = 0.0

    def update(self, n: int) -> None:
        """Add `n` done items and redraw when due."""
        self.done += n
        now = time.monotonic()
        if self._enabled and (now - self._drawn >= 0.1 or self.done == self.total):
            self._drawn = now
            self._stream.write("\r" + self.render(now))
            self._stream.flush()

    def render(self, now: float | None = None) -> str:
        """The bar as text."""
        elapsed = max((now or time.monotonic()) - self._started, 1e-9)
        rate = f"{self.done / elapsed:,.0f} jobs/s"
        if not self.total:
            return f"{self._label} {self.done:,}  {rate}"
        frac = min(self.done / self.total, 1.0)
        width = 30
        filled = int(frac * width)
        bar = "#" * filled + "-" * (width - filled)
        return f"[{bar}] {self.done:,}/{self.total:,} {frac:4.0%}  {rate}"

    def close(self) -> None:
        """Finish the line."""
        if self._enabled:
            self._stream.write("\r" + self.render() + "\n")
            self._stream.flush()
