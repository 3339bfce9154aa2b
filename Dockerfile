# delayq server image: the server and its runtime dependencies, nothing else,
# installed with the same commands as `make run` (Makefile, RUN_STAMP). No
# Redis inside: set DELAYQ_REDIS_URL (deploy/compose.yaml runs one beside it).
# No Docker engine runs in CI here: tests/unit/test_deploy.py checks this file
# and deploy/ statically.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
# Dependencies first, from the pyprojects alone: this layer is rebuilt only
# when a dependency changes, not on every source change.
COPY scripts/runtime_requirements.py scripts/
COPY clients/python/pyproject.toml clients/python/
COPY server/pyproject.toml server/
RUN python -m venv /opt/delayq \
 && python scripts/runtime_requirements.py > /tmp/runtime-requirements.txt \
 && /opt/delayq/bin/python -m pip install --no-cache-dir -r /tmp/runtime-requirements.txt
# Then the sources, without dependencies (installed above).
COPY clients/python clients/python
COPY server server
RUN /opt/delayq/bin/python -m pip install --no-cache-dir --no-deps ./clients/python ./server

FROM python:3.11-slim-bookworm
RUN useradd --system --uid 10001 --home-dir /var/lib/delayq --create-home delayq
COPY --from=build /opt/delayq /opt/delayq
USER delayq
WORKDIR /var/lib/delayq
# Listening on every interface, so auth is on (README "Docker"): the first
# start writes an admin token to the file below (mode 0600, in the volume);
# read it with `docker exec <c> cat <file>`. Add DELAYQ_TLS_CERT/DELAYQ_TLS_KEY
# (mounted files) for TLS. The admin HTTP port (/metrics) stays off unless
# DELAYQ_HTTP_LISTEN is set (compose sets 0.0.0.0:9464).
ENV PATH=/opt/delayq/bin:$PATH \
    DELAYQ_LISTEN=0.0.0.0:50051 \
    DELAYQ_AUTH=1 \
    DELAYQ_AUTH_BOOTSTRAP_TOKEN_FILE=/var/lib/delayq/admin-token \
    DELAYQ_LOG_FORMAT=json
VOLUME /var/lib/delayq
EXPOSE 50051 9464
# gRPC health (grpc.health.v1, no token needed), probed by a module shipped in the image.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-m", "delayq_server.healthcheck"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["delayq-server"]
