"""Exceptions a handler raises to choose its job's outcome explicitly."""

from __future__ import annotations

from datetime import timedelta

from delayq._convert import DurationLike, to_timedelta

__all__ = ["DeadLetter", "Retry"]


class Retry(Exception):
    """Raise from a handler to retry the job after `delay` (default: the job's retry policy).

    The attempt still counts: a job at its last attempt is dead-lettered.
    """

    def __init__(self, delay: DurationLike | None = None, reason: str = "retry requested") -> None:
        super().__init__(reason)
        self.delay: timedelta | None = None if delay is None else to_timedelta(delay)
        self.reason = reason


class DeadLetter(Exception):
    """Raise from a handler to send the job to the dead-letter set now, with `reason`."""

    def __init__(self, reason: str = "dead-lettered by handler") -> None:
        super().__init__(reason)
        self.reason = reason
