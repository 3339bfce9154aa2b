"""`python -m delayq_server.healthcheck`: exit 0 when the server's gRPC health is SERVING.

The Docker image's HEALTHCHECK. It probes DELAYQ_LISTEN (0.0.0.0 becomes
127.0.0.1), or the address given as its argument; with DELAYQ_TLS_CERT set it
speaks TLS, trusting DELAYQ_HEALTHCHECK_CA (default: the system roots).
Health needs no token (auth/rules.py). A server requiring client
certificates (mTLS) cannot be probed this way: use the HTTP port's /healthz.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 3.0


def target(argv: list[str], env: dict[str, str]) -> str:
    if argv:
        return argv[0]
    host, _, port = env.get("DELAYQ_LISTEN", "127.0.0.1:50051").rpartition(":")
    if host in ("0.0.0.0", "[::]", ""):
        host = "127.0.0.1"
    return f"{host}:{port}"


def probe(address: str, env: dict[str, str]) -> bool:
    if env.get("DELAYQ_TLS_CERT"):
        ca = env.get("DELAYQ_HEALTHCHECK_CA")
        roots = Path(ca).read_bytes() if ca else None
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(roots))
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        except grpc.RpcError as exc:
            sys.stderr.write(f"unhealthy: {exc.code().name}\n")
            return False
    return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


def main() -> None:
    env = dict(os.environ)
    sys.exit(0 if probe(target(sys.argv[1:], env), env) else 1)


if __name__ == "__main__":
    main()
