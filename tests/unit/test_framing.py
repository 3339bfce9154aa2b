"""Consume messages under a byte cap: how a claimed batch is split."""

from __future__ import annotations

from delayq.v1 import job_pb2, service_pb2
from delayq_server import framing
from delayq_server.config import Config
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
