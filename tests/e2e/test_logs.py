"""Server logs: JSON lines with trace ids for notable events; never payloads or tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.duration_pb2 import Duration

from delayq.v1 import admin_pb2, admin_pb2_grpc, service_pb2, service_pb2_grpc
from tests.support.auth import ROLE, _Bearer
from tests.support.rpc import Consumer
from tests.support.servers import DelayqProcess, ManagedRedis, wait_until

PAYLOAD = b"PAYLOAD-7f3a-do-not-log"
HEADER = "HEADER-91c2-do-not-log"


def _events(server: DelayqProcess) -> list[dict[str, Any]]:
    """Every log line as JSON (the two plain 'delayq: ...' start lines aside)."""
    return [json.loads(line) for line in list(server.output) if not line.startswith("delayq: ")]


def test_json_logs_carry_events_and_trace_ids_but_no_secrets(tmp_path: Path) -> None:
    token_file = tmp_path / "admin-token"
    args = [
        "--auth",
        "--auth-bootstrap-token-file",
        str(token_file),
        "--log-format",
        "json",
        "--otel",
    ]
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}  # traced, not exported
    with (
        ManagedRedis(tmp_path / "redis", appendonly=False) as redis,
        DelayqProcess(redis.url, args, env=env) as server,
        server.channel() as raw,
    ):
        admin_token = token_file.read_text().strip()
        admin = admin_pb2_grpc.AdminServiceStub(grpc.intercept_channel(raw, _Bearer(admin_token)))
        req = admin_pb2.CreateTokenRequest(
            namespace="default", roles=[ROLE["produce"], ROLE["consume"]]
        )
        token = admin.CreateToken(req, timeout=10).token
        stub = service_pb2_grpc.DelayQueueServiceStub(grpc.intercept_channel(raw, _Bearer(token)))
        for _ in range(2):
            stub.Enqueue(
                service_pb2.EnqueueRequest(
                    queue="logged", payload=PAYLOAD, headers={"h": HEADER}, max_attempts=1
                )
            )
        with Consumer(
            stub, ["logged"], max_outstanding=2, lease_ms=3_000
        ) as c:  # nack first in time
            first, second = c.take(2)
            stub.Nack(
                service_pb2.NackRequest(
                    lease_token=first.lease_token, dead_letter=True, reason="poison"
                )
            )
            # second's lease runs out on its only attempt: expired, then dead-lettered.
            wait_until(
                lambda: any(e.get("event") == "lease_expired" for e in _events(server)),
                timeout=30,
                interval=0.1,
            )
        wait_until(
            lambda: any(e.get("event") == "stream_closed" for e in _events(server)),
            timeout=10,
            interval=0.05,
        )
        stub.Enqueue(
            service_pb2.EnqueueRequest(queue="logged", payload=PAYLOAD, delay=Duration(seconds=60))
        )
        output = "".join(server.output)
    events = _events(server)  # every line parsed: no plain-text line slipped through
    by_event = {e.get("event"): e for e in events if "event" in e}
    opened = by_event["stream_opened"]
    assert opened["peer"].startswith("ipv4:127.0.0.1:") and opened["queues"] == "logged"
    assert len(opened["trace_id"]) == 32 and len(opened["span_id"]) == 16  # inside the RPC's span
    assert by_event["stream_closed"]["delivered"] == 2
    dead = [e for e in events if e.get("event") == "dead_lettered"]
    assert {(e["job_id"], e["reason"]) for e in dead} == {
        (first.job.id, "poison"),
        (second.job.id, "lease expired on the final attempt"),
    }
    assert by_event["lease_expired"]["job_id"] == second.job.id
    for secret in (
        PAYLOAD.decode(),
        HEADER,
        admin_token,
        token,
        first.lease_token,
        second.lease_token,
    ):
        assert secret not in output
    # The lease nonce alone (the token's secret part) never appears either.
    assert first.lease_token.rsplit("/", 1)[1] not in output
