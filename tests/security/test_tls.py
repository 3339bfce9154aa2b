"""TLS and mutual TLS on the gRPC port, with certificates made in the test by trustme."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from delayq.v1 import service_pb2, service_pb2_grpc
from tests.support.servers import DelayqProcess

OVERRIDE = (("grpc.ssl_target_name_override", "localhost"),)


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


def _server_files(ca: trustme.CA, tmp: Path) -> list[str]:
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp / "server.key"))
    cert.cert_chain_pems[0].write_to_path(str(tmp / "server.pem"))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(tmp / "server.pem"), append=True)
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    return ["--tls-cert", str(tmp / "server.pem"), "--tls-key", str(tmp / "server.key")]


def _creds(ca: trustme.CA, client: trustme.LeafCert | None = None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    return grpc.ssl_channel_credentials(
        root_certificates=ca.cert_pem.bytes(),
        private_key=client.private_key_pem.bytes(),
        certificate_chain=b"".join(p.bytes() for p in client.cert_chain_pems),
    )


def _enqueue(channel: grpc.Channel, ns: str) -> grpc.StatusCode:
    stub = service_pb2_grpc.DelayQueueServiceStub(channel)
    try:
        stub.Enqueue(service_pb2.EnqueueRequest(namespace=ns, queue="q", payload=b"x"), timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return,unused-ignore]


@pytest.fixture
def tls_server(ca: trustme.CA, tmp_path: Path, redis_url: str) -> Iterator[DelayqProcess]:
    with DelayqProcess(redis_url, _server_files(ca, tmp_path)) as proc:
        yield proc


def test_tls_serves_and_refuses_plaintext(ca: trustme.CA, tls_server: DelayqProcess) -> None:
    with grpc.secure_channel(tls_server.address, _creds(ca), options=OVERRIDE) as ch:
        assert _enqueue(ch, "default") == grpc.StatusCode.OK
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(tls_server.address) as plain:
        assert _enqueue(plain, "default") == grpc.StatusCode.UNAVAILABLE
    # A client that does not trust the server's CA refuses the handshake too.
    with grpc.secure_channel(
        tls_server.address, _creds(trustme.CA()), options=OVERRIDE
    ) as stranger:
        assert _enqueue(stranger, "default") == grpc.StatusCode.UNAVAILABLE


def test_mtls_maps_client_certificates_to_roles(
    ca: trustme.CA, tmp_path: Path, redis_url: str
) -> None:
    roles = tmp_path / "roles.json"
    roles.write_text(json.dumps({"worker-a": {"namespace": "tenant-a", "roles": ["produce"]}}))
    args = [
        *_server_files(ca, tmp_path),
        "--tls-client-ca", str(tmp_path / "ca.pem"),
        "--tls-client-roles", str(roles),
        "--auth",
    ]  # fmt: skip
    with DelayqProcess(redis_url, args) as proc:
        mapped = ca.issue_cert("worker-a", common_name="worker-a")
        with grpc.secure_channel(proc.address, _creds(ca, mapped), options=OVERRIDE) as ch:
            assert _enqueue(ch, "tenant-a") == grpc.StatusCode.OK
            assert _enqueue(ch, "tenant-b") == grpc.StatusCode.PERMISSION_DENIED
        unmapped = ca.issue_cert("stranger", common_name="stranger")
        with grpc.secure_channel(proc.address, _creds(ca, unmapped), options=OVERRIDE) as ch:
            assert _enqueue(ch, "tenant-a") == grpc.StatusCode.UNAUTHENTICATED
        # No client certificate: the handshake itself fails.
        with grpc.secure_channel(proc.address, _creds(ca), options=OVERRIDE) as ch:
            assert _enqueue(ch, "tenant-a") == grpc.StatusCode.UNAVAILABLE
        # A certificate from another CA is refused the same way.
        foreign = trustme.CA().issue_cert("worker-a", common_name="worker-a")
        with grpc.secure_channel(proc.address, _creds(ca, foreign), options=OVERRIDE) as ch:
            assert _enqueue(ch, "tenant-a") == grpc.StatusCode.UNAVAILABLE
