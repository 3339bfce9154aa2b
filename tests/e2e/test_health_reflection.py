"""Operators' path: health checks and server reflection (what grpcurl relies on)."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.support.servers import DelayqProcess, free_port


def test_health_is_serving(channel: grpc.Channel) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "delayq.v1.DelayQueueService"):
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_reflection_lists_and_describes_the_service(channel: grpc.Channel) -> None:
    db = ProtoReflectionDescriptorDatabase(channel)
    services = set(db.get_services())
    assert {"delayq.v1.DelayQueueService", "grpc.health.v1.Health"} <= services
    desc = db.FindFileContainingSymbol("delayq.v1.DelayQueueService")
    methods = {m.name for s in desc.service for m in s.method}
    assert {"Enqueue", "EnqueueBatch", "Consume", "Ack", "Nack", "ExtendLease", "Query",
            "Delete", "GetQueueStats"} <= methods  # fmt: skip


def test_reflection_finds_methods_and_serves_comments(channel: grpc.Channel) -> None:
    """grpcurl `describe Service.Method` asks for the method's symbol; comments
    come from the descriptors' source info (server/delayq_server/reflection.py)."""
    db = ProtoReflectionDescriptorDatabase(channel)
    desc = db.FindFileContainingSymbol("delayq.v1.DelayQueueService.Enqueue")
    assert desc.name == "delayq/v1/service.proto"
    comments = [loc.leading_comments for loc in desc.source_code_info.location]
    assert any("Enqueue stores one job" in c for c in comments)
    health = db.FindFileContainingSymbol("grpc.health.v1.Health")  # still from the pool
    assert health.service[0].name == "Health"


def test_docker_healthcheck_probe(server: DelayqProcess) -> None:
    """The image's HEALTHCHECK command: 0 when SERVING, 1 when nothing answers."""
    probe = [sys.executable, "-m", "delayq_server.healthcheck"]
    ok = subprocess.run([*probe, server.address], capture_output=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    env = {**os.environ, "DELAYQ_LISTEN": f"0.0.0.0:{server.port}"}  # the image's way
    assert subprocess.run(probe, env=env, capture_output=True, timeout=30).returncode == 0
    down = subprocess.run([*probe, f"127.0.0.1:{free_port()}"], capture_output=True, timeout=30)
    assert down.returncode == 1
