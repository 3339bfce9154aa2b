"""Splits a claimed batch into ConsumeResponse messages under a byte cap."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def _field_bytes(size: int) -> int:
    """A repeated message field's bytes in its parent: tag, length varint, body."""
    length, rest = 1, size
    while rest >= 0x80:
        rest >>= 7
        length += 1
    return 1 + length + size


def split(sizes: Sequence[int], cap: int) -> Iterator[tuple[int, int]]:
    """Yields [start, end) ranges whose encoded deliveries fit in ``cap`` bytes.

    A range always holds at least one delivery: config refuses a cap below the
    largest possible delivery (validation.max_delivery_bytes), so that one fits.
    """
    start, used = 0, 0
    for i, size in enumerate(sizes):
        need = _field_bytes(size)
        if i > start and used + need > cap:
            yield start, i
            start, used = i, 0
        used += need
    if start < len(sizes):
        yield start, len(sizes)
