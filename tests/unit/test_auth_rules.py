"""Every RPC has an explicit auth rule; token and certificate-map parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from delayq.v1 import admin_pb2, service_pb2
from delayq_server.auth import tokens
from delayq_server.auth.certs import CertRoles
from delayq_server.auth.principal import ADMIN, CONSUME, PRODUCE, READ
from delayq_server.auth.rules import DEFAULT_RULE, RULES, Scope, rule_for


def test_every_rpc_has_an_explicit_rule() -> None:
    """A new RPC must be given a role here, or it falls to admin-of-every-namespace."""
    for file in (service_pb2, admin_pb2):
        for service in file.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                path = f"/{service.full_name}/{method.name}"
                assert path in RULES, f"{path} has no auth rule (auth/rules.py)"


def test_roles_follow_the_issue() -> None:
    q = "/delayq.v1.DelayQueueService/"
    assert {m for m, r in RULES.items() if r.role == PRODUCE} == {
        q + "Enqueue",
        q + "EnqueueBatch",
        q + "EnqueueStream",
    }
    assert {m.rsplit("/", 1)[1] for m, r in RULES.items() if r.role == CONSUME} == {
        "Consume", "Ack", "Nack", "ExtendLease", "Release"
    }  # fmt: skip
    assert {m.rsplit("/", 1)[1] for m, r in RULES.items() if r.role == READ} == {
        "Query", "GetQueueStats", "ListDeadJobs", "ListQueues", "GetQueue", "ListJobs"
    }  # fmt: skip
    # Queue administration (issue 14): every change needs admin.
    a = "/delayq.v1.AdminService/"
    for rpc in ("CreateQueue", "UpdateQueue", "DeleteQueue", "PauseQueue", "ResumeQueue",
                "PurgeQueue", "RescheduleJob", "UpdateJob", "RedriveDeadLetters"):  # fmt: skip
        assert RULES[a + rpc].role == ADMIN
    assert RULES[q + "Delete"].role == ADMIN and RULES[q + "PurgeDeadJobs"].role == ADMIN
    assert rule_for("/grpc.health.v1.Health/Check") is None
    assert rule_for("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is None
    assert rule_for("/delayq.v1.DelayQueueService/SomethingNew") == DEFAULT_RULE
    assert DEFAULT_RULE.scope is Scope.ALL


def test_token_format() -> None:
    token, token_id = tokens.generate()
    assert tokens.token_id_of(token) == token_id and len(token_id) == 16
    assert tokens.token_id_of(token + "x") is None and tokens.token_id_of("dq_zz_x") is None
    assert len(tokens.digest(token)) == 64


def test_cert_roles_file(tmp_path: Path) -> None:
    good = tmp_path / "roles.json"
    good.write_text(json.dumps({"w": {"namespace": "a", "roles": ["consume"]}}))
    roles = CertRoles.load(str(good))
    p = roles.lookup({"x509_common_name": [b"w"]})
    assert p is not None and p.namespace == "a" and p.roles == {"consume"}
    assert roles.lookup({"x509_common_name": [b"other"]}) is None
    for bad in (
        {"w": {"namespace": "a:b", "roles": ["consume"]}},
        {"w": {"namespace": "a", "roles": []}},
        {"w": {"namespace": "a", "roles": ["root"]}},
    ):
        good.write_text(json.dumps(bad))
        with pytest.raises(ValueError):
            CertRoles.load(str(good))


def test_security_settings_from_flags_and_environment() -> None:
    from delayq_server import config

    assert config.load([], env={}).auth is False
    assert config.load([], env={"DELAYQ_AUTH": "1"}).auth is True
    assert config.load(["--no-auth"], env={"DELAYQ_AUTH": "1"}).auth is False
    assert config.load(["--no-reflection"], env={}).reflection is False
    assert config.load([], env={"DELAYQ_REFLECTION": "0"}).reflection is False
    for argv in (
        ["--tls-cert", "c.pem"],
        ["--tls-client-ca", "ca.pem"],
        ["--quota-queues", "-1"],
        ["--max-message-bytes", "1000"],  # below max_response_bytes
    ):
        with pytest.raises(SystemExit):
            config.load(argv, env={})
    with pytest.raises(SystemExit):
        config.load([], env={"DELAYQ_AUTH": "maybe"})
