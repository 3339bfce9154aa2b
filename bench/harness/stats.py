"""Figures from raw runs: percentiles, median/min/max over runs, ratios."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class Figure:
    """One measure for one system: a value per run (inf = timed out, nan = not measured)."""

    runs: list[float] = field(default_factory=list)

    @property
    def measured(self) -> list[float]:
        return [v for v in self.runs if not math.isnan(v)]

    @property
    def median(self) -> float:
        vals = self.measured
        return statistics.median(vals) if vals else math.nan

    @property
    def low(self) -> float:
        vals = self.measured
        return min(vals) if vals else math.nan

    @property
    def high(self) -> float:
        vals = self.measured
        return max(vals) if vals else math.nan

    def as_json(self) -> dict[str, object]:
        def clean(v: float) -> float | str | None:
            if math.isnan(v):
                return None
            if math.isinf(v):
                return "timeout"
            return v

        return {
            "median": clean(self.median),
            "min": clean(self.low),
            "max": clean(self.high),
            "runs": [clean(v) for v in self.runs],
        }


def ratio(ours: float, theirs: float) -> float:
    """ours / theirs, nan when either side is missing or unbounded."""
    if any(math.isnan(v) or math.isinf(v) for v in (ours, theirs)) or theirs == 0:
        return math.nan
    return ours / theirs
