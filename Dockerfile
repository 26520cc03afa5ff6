# syntax=docker/dockerfile:1
#
# Production image for the kcache server.
#
#   docker build -t kcache:0.1.0 .
#   docker run --rm -p 8765:8765 \
#     -e KCACHE_BLOB_URL=s3://kcache/blobs -e KCACHE_INDEX_URL=redis://redis:6379/0 \
#     -e KCACHE_TOKENS_FILE=/etc/kcache/tokens/tokens.json \
#     -v "$PWD/tokens.json:/etc/kcache/tokens/tokens.json:ro" kcache:0.1.0
#
# Nothing secret is baked in: storage URLs, S3 credentials and the bearer-token file all come
# from the environment at run time (the Helm chart in helm/kcache wires them from a ConfigMap
# and a Secret). The server refuses to bind 0.0.0.0 without tokens, so a bare `docker run`
# with no KCACHE_TOKENS_FILE exits at once by design.
#
# Needs BuildKit (the default builder since Docker 23) for the RUN --mount below.

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# ---------------------------------------------------------------------------------------------
# builder: turn the project and every runtime dependency into wheels. Compilers and build
# backends (hatchling) stay in this stage.
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src

# Only what the wheel is built from (.dockerignore allow-lists the same paths).
COPY pyproject.toml README.md ./
COPY schemas/ schemas/
COPY client/ client/
COPY service/ service/

RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[s3,redis]'

# ---------------------------------------------------------------------------------------------
# runtime: a virtualenv holding the wheels from the builder, run as the fixed non-root UID/GID
# 10001 (the Helm chart's securityContext uses the same numbers).
# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="kcache" \
      org.opencontainers.image.description="Cache service for compiled GPU kernels (Triton / PyTorch Inductor)" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/kcache \
    PATH=/opt/kcache/bin:$PATH

# The wheels are bind-mounted from the builder, so they never land in a layer of this image.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv "$VIRTUAL_ENV" \
    && "$VIRTUAL_ENV/bin/pip" install --no-cache-dir --no-index --find-links=/wheels /wheels/*.whl \
    && groupadd --system --gid 10001 kcache \
    && useradd --system --uid 10001 --gid 10001 --home-dir /home/kcache \
        --create-home --shell /usr/sbin/nologin kcache \
    && install -d -o 10001 -g 10001 -m 0750 /data

# Set after the install so that pip still precompiles the installed modules: with a read-only
# root filesystem the server could not write .pyc files at run time anyway.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    KCACHE_DATA_DIR=/data

WORKDIR /home/kcache
USER 10001:10001

EXPOSE 8765

# Liveness only (no backend check): /readyz is for load balancers, not for restarting.
# python:slim has no curl, so the check is done with the standard library.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8765/healthz', timeout=4)"]

ENTRYPOINT ["kcache"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8765", "--workers", "4"]
