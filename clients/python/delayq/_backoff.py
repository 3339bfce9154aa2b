"""Jittered exponential backoff shared by client retries and worker reconnects."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Wait ``min(maximum, initial * multiplier**n)`` before retry n (from 0), minus a random
    fraction of at most `jitter` so that many clients do not retry in step."""

    initial: float = 0.1
    maximum: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial:
            raise ValueError("need 0 < initial <= maximum")
        if self.multiplier < 1:
            raise ValueError("multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number `attempt` (0-based)."""
        # Cap the exponent so a long outage cannot overflow the float.
        base = min(self.maximum, self.initial * self.multiplier ** min(attempt, 64))
        return base * (1.0 - self.jitter * (rng or random).random())
