"""The test-only clock skew setting: parsed signed, and it moves every local wall-clock read."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from delayq_server import clock, config, ids
from tests.chaos.faults import _job_id_ms


@pytest.fixture
def skew() -> Iterator[None]:
    yield
    clock.set_skew_ms(0)


def test_flag_and_environment_take_signed_durations() -> None:
    assert config.load(["--clock-skew=-5m"], env={}).clock_skew_ms == -300_000
    assert config.load([], env={"DELAYQ_CLOCK_SKEW": "90s"}).clock_skew_ms == 90_000
    assert config.load([], env={}).clock_skew_ms == 0


@pytest.mark.parametrize("value", ["soon", "2d", "-2d"])
def test_refuses_a_skew_that_is_not_a_duration_or_out_of_range(value: str) -> None:
    with pytest.raises(SystemExit):
        config.load([f"--clock-skew={value}"], env={})


def test_job_ids_carry_the_skewed_clock(skew: None) -> None:
    clock.set_skew_ms(600_000)
    stamped = _job_id_ms(ids.new_job_id(0, 1))
    assert stamped - time.time() * 1000 > 590_000
