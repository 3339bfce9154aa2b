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
ENV PATH=/opt/delayq/bin:$PATH \
    DELAYQ_LISTEN=0.0.0.0:50051 \
    DELAYQ_DATA_DIR=/var/lib/delayq/redis
EXPOSE 50051
STOPSIGNAL SIGTERM
ENTRYPOINT ["delayq-server"]
