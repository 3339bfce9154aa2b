"""Job id generation: record groups follow creation time (docs/decisions.md,
"record groups follow creation time"). No Redis, no server."""

from __future__ import annotations

import base64
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def _decoded(job_id: str) -> tuple[int, int]:
    """An id's creation ms and 64-bit random part (encode_id's inverse)."""
    v = int(job_id + "0", 32)  # the dropped 24th digit is padding
    assert v & 255 == 0
    return v >> 72, (v >> 8) & ((1 << 64) - 1)


@given(ms=st.integers(min_value=0, max_value=(1 << 48) - 1), count=st.integers(1, 40))
def test_batch_ids_are_encode_id_digits(ms: int, count: int) -> None:
    # new_job_ids builds digits by table, not through encode_id: each id must be
    # encode_id's text for its ms and a random part that carries the group bits.
    with patch.object(clock, "wall_ns", lambda: ms * 1_000_000 + 999_999):
        made = ids.new_job_ids(count)
    for job_id in made:
        made_ms, rand = _decoded(job_id)
        assert made_ms == ms
        assert rand & (31 << 57) == ids.group_bits(ms)
        assert ids.encode_id(ms, rand) == job_id


def test_batch_ids_use_all_59_random_bits(frozen: list[int]) -> None:
    randoms = [_decoded(m)[1] for m in ids.new_job_ids(4000)]
    varying = 0
    for bit in range(64):
        ones = sum(r >> bit & 1 for r in randoms)
        if 1000 < ones < 3000:  # a fair bit is set about 2,000 times in 4,000
            varying += 1
        else:
            assert ones in (0, 4000), f"bit {bit} is biased: {ones} of 4000"
    assert varying == 59  # 64 minus the 5 group bits


@pytest.mark.parametrize("count", [1, 7, 512, 513, 1000])
def test_a_batch_of_ids_shares_its_time_and_nothing_else(frozen: list[int], count: int) -> None:
    made = ids.new_job_ids(count) + ids.new_job_ids(count)
    assert len(set(made)) == 2 * count  # fresh randoms across calls and block refills
    assert {ids.created_ms(m) for m in made} == {T}
    assert all(ids.shard_of(m) == 0 for m in made)
    assert ids.shard_of(ids.with_shard(made[0], 5, 8)) == 5
    assert ids.with_shard(made[0], 0, 1) == made[0]


@given(
    ms=st.integers(min_value=0, max_value=(1 << 48) - 1),
    rand=st.integers(min_value=0, max_value=(1 << 64) - 1),
)
def test_encode_id_is_base32hex_of_the_14_bytes(ms: int, rand: int) -> None:
    raw = ms.to_bytes(6, "big") + rand.to_bytes(8, "big")
    assert ids.encode_id(ms, rand) == base64.b32hexencode(raw).decode().lower().rstrip("=")
