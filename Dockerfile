# syntax=docker/dockerfile:1
# GRPO Lens, self-hosted (README "Docker"):
#   docker build -t grpo-lens .
#   docker run -d -p 127.0.0.1:8000:8000 --read-only --tmpfs /tmp -v grpo-lens-runs:/data/runs grpo-lens
#
# Layers, slowest-changing first, so a source edit rebuilds only the COPY layers at the end (seconds):
# base -> user and venv -> locked dependencies (hashes) -> torch (pinned version and variant) -> source.
# The app is not pip-installed: one copy lives in /app (PYTHONPATH), templates and static files beside it.
#
# The base is pinned by its exact tag. To pin its digest as well, where the registry is reachable:
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm   (or: skopeo inspect docker://...)
# and build with --build-arg BASE_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>.
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

# Optional local torch wheels (find-links). Empty unless the build passes
# --build-context torch-wheels=DIR (an air-gapped machine, or a wheel built in-house).
FROM scratch AS torch-wheels

FROM ${BASE_IMAGE}

# Build-time settings. An index URL carrying credentials belongs in a pip.conf passed as the secret
# `pip_conf`, not here: build arguments are recorded in the image history. A proxy's CA: the secret `pip_ca`.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_VERSION=2.13.0
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# A user with a home; a venv without pip (the base's pip installs into it with --python).
RUN groupadd --system --gid 10001 lens \
 && useradd --system --uid 10001 --gid lens --home-dir /home/lens --create-home --shell /usr/sbin/nologin lens \
 && python -m venv --without-pip /opt/venv \
 && mkdir /app \
 && mkdir -p /data/runs && chown lens:lens /data/runs

# Every dependency but torch, exactly as locked (make lock), each file checked against its hash, wheels only
# (nothing compiled in the image). The lock is copied, not bind-mounted, so that a changed lock rebuilds
# this layer with any builder (buildah's cache does not look at what is mounted).
COPY requirements.lock /opt/venv/requirements.lock
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_ca \
    if [ -f /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi; \
    python -m pip --python /opt/venv/bin/python install --no-cache-dir --disable-pip-version-check \
        --root-user-action=ignore --only-binary=:all: --require-hashes -r /opt/venv/requirements.lock

# torch, pinned by version and variant (cpu, cu128, ...; empty for PyPI's default build) from its own index.
# Its pure-Python dependencies are already there from the lock; a CUDA variant adds its nvidia-* wheels.
# TORCH_INDEX_URL empty: the torch-wheels build context only (no network).
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_ca \
    --mount=type=bind,from=torch-wheels,target=/tmp/torch-wheels \
    if [ -f /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -f /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi; \
    if [ -n "$TORCH_INDEX_URL" ]; then index="--index-url $TORCH_INDEX_URL"; else index="--no-index"; fi; \
    python -m pip --python /opt/venv/bin/python install --no-cache-dir --disable-pip-version-check \
        --root-user-action=ignore --only-binary=:all: $index --find-links /tmp/torch-wheels "torch==${TORCH_VERSION}${TORCH_VARIANT:++$TORCH_VARIANT}" \
 && python -m pip --python /opt/venv/bin/python check

# XDG_CACHE_HOME: any library cache goes to /tmp, the one writable place under --read-only besides the runs.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    HOME=/home/lens \
    XDG_CACHE_HOME=/tmp/.cache \
    GRPO_LENS_RUNS_DIR=/data/runs
COPY docker/entrypoint.sh /usr/local/bin/grpo-lens-entrypoint

# The runtime settings come before the source, so that a source edit redoes only the COPY layers below.
USER lens
VOLUME /data/runs
EXPOSE 8000
HEALTHCHECK --start-period=60s --interval=30s --timeout=5s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
ENTRYPOINT ["grpo-lens-entrypoint"]
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000", "--timeout-graceful-shutdown", "3", \
     "--http", "app.server:HeaderTimeoutHttpTools"]

# The source, root-owned (the app cannot change its own code), least often edited first.
WORKDIR /app
COPY vendor ./vendor
COPY templates ./templates
COPY static ./static
COPY grpo ./grpo
COPY app ./app
