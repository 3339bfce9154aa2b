"""Job id generation: record groups follow creation time (docs/decisions.md,
"record groups follow creation time"). No Redis, no server."""

from __future__ import annotations

import pytest

from delayq_server import clock, ids

T = 1_800_000_000_123  # a creation time in ms


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pins the clock ids are stamped with; set ``frozen[0]`` to move it."""
    now = [T]
    monkeypatch.setattr(clock, "wall_ns", lambda: now[0] * 1_000_000)
    return now


def test_ids_of_one_window_spread_over_32_groups_of_its_slot(frozen: list[int]) -> None:
    made = [ids.new_job_id(0, 1) for _ in range(4000)]
    groups = {m[10:12] for m in made}
    # Character 11 names the window's slot; character 12 stays random.
    assert {g[0] for g in groups} == {ids.encode_id(T, ids.group_bits(T))[10]}
    assert len(groups) == 32
    assert len(set(made)) == len(made)  # 59 random bits still tell them apart


def test_windows_take_turns_over_every_group(frozen: list[int]) -> None:
    slots = []
    for w in range(32):
        frozen[0] = T + w * ids.GROUP_WINDOW_MS
        slots.append(ids.new_job_id(0, 1)[10])
    assert len(set(slots)) == 32  # one turn visits each slot once
    frozen[0] = T + 32 * ids.GROUP_WINDOW_MS
    assert ids.new_job_id(0, 1)[10] == slots[0]  # and then starts over


def test_time_bits_leave_the_timestamp_and_shard_alone(frozen: list[int]) -> None:
    one = ids.new_job_id(3, 4)
    assert ids.created_ms(one) == T
    assert ids.shard_of(one) == 3
