"""Consume messages under a byte cap: how a claimed batch is split."""

from __future__ import annotations

import dataclasses

from delayq.v1 import job_pb2, service_pb2
from delayq_server import convert, framing, ids
from delayq_server.config import Config
from delayq_server.store import JobRecord, JobState, ShardKeys
from delayq_server.validation import max_delivery_bytes


def test_split_keeps_every_message_under_the_cap() -> None:
    deliveries = [job_pb2.Delivery(job=job_pb2.Job(payload=b"x" * n)) for n in (10, 500, 300, 5)]
    sizes = [d.ByteSize() for d in deliveries]
    cap = 700
    ranges = list(framing.split(sizes, cap))
    assert [i for a, b in ranges for i in range(a, b)] == [0, 1, 2, 3]  # all, in order
    for a, b in ranges:
        msg = service_pb2.ConsumeResponse(deliveries=deliveries[a:b])
        assert msg.ByteSize() <= cap


def test_one_delivery_over_the_cap_still_goes_alone() -> None:
    assert list(framing.split([50, 5000, 50], 100)) == [(0, 1), (1, 2), (2, 3)]
    assert list(framing.split([], 100)) == []


def test_the_largest_job_fits_the_default_cap() -> None:
    cfg = Config()
    assert max_delivery_bytes(cfg.max_payload_bytes) == 819_843
    assert max_delivery_bytes(cfg.max_payload_bytes) < cfg.max_response_bytes < 4 * 1024 * 1024


def test_bound_is_never_below_the_encoded_delivery() -> None:
    keys = ShardKeys("n" * 64, "q" * 64, 9999)
    job_id = "06h03hkqjpgep0lubf6r2to-9999"
    worst = JobRecord(
        JobState.LEASED, 1000, 1000, 2**52, 2**52, 2**52, 2**52, 2**52,
        "f" * 8 + "." + "f" * 16 + "." + "9" * 20 + ".1000", "é" * 4096,
        2**40, 2**40, 10.0, 1.0,
        {("k" * 255) + str(i): "€" * 2730 for i in range(64)}, b"x" * 262_144,
    )  # fmt: skip
    small = dataclasses.replace(worst, headers={"a": "b"}, last_error="", payload=b"x")
    framed_sizes = []
    for rec in (worst, small):
        d = job_pb2.Delivery(
            job=convert.job(keys, job_id, rec, 2**52),
            lease_token=ids.format_token(keys, job_id, rec.nonce),
            attempt=rec.attempts,
            lease_deadline=convert.ts(2**52),
        )
        framed = service_pb2.ConsumeResponse(deliveries=[d]).ByteSize()
        assert framing.bound(rec) >= framed
        framed_sizes.append(framed)
    # Even this (its last_error twice the valid size) fits the default cap on its own.
    assert framed_sizes[0] < Config().max_response_bytes
