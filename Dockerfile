# delayq server image. The install steps are the Makefile's (`make deps`
# installs the same packages into .venv); no Docker engine runs in CI here,
# so the Makefile is what is tested.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY clients/python clients/python
COPY server server
RUN python -m venv /opt/delayq \
 && /opt/delayq/bin/python -m pip install --no-cache-dir --upgrade pip \
 && /opt/delayq/bin/python -m pip install --no-cache-dir ./clients/python ./server

FROM python:3.11-slim-bookworm
# redis-server is included so the image can run with no Redis URL (managed
# local Redis, as `make run`); give DELAYQ_REDIS_URL to use your own.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/delayq --create-home delayq
COPY --from=build /opt/delayq /opt/delayq
USER delayq
WORKDIR /var/lib/delayq
# Listening on every interface, so auth is on (README "Running in Docker
# securely"): the first start writes an admin token to the file below (mode
# 0600, in the data volume); read it with `docker exec <c> cat <file>`.
# Add DELAYQ_TLS_CERT/DELAYQ_TLS_KEY (mounted files) for TLS; reflection
# exposes only the public contract and can be turned off with DELAYQ_REFLECTION=0.
ENV PATH=/opt/delayq/bin:$PATH \
    DELAYQ_LISTEN=0.0.0.0:50051 \
    DELAYQ_DATA_DIR=/var/lib/delayq/redis \
    DELAYQ_AUTH=1 \
    DELAYQ_AUTH_BOOTSTRAP_TOKEN_FILE=/var/lib/delayq/admin-token
EXPOSE 50051
STOPSIGNAL SIGTERM
ENTRYPOINT ["delayq-server"]
