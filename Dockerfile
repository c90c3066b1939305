# syntax=docker/dockerfile:1
# Two images of `app`, both built with the stripped `dist` profile:
#
#   docker build -t app-worker .                  the default: a GPU worker (or the embedded
#                                                 `app`) that runs users' PyTorch code: python3
#                                                 with torch and its CUDA libraries, git, and
#                                                 `app` with the built-in trainer (`app train`)
#   docker build --target server -t app-server .  the head node alone: no Python, no torch
#
# docker-compose.yml builds both. GPUs reach the worker through the NVIDIA Container Toolkit
# (`--gpus all`, or the compose file's device reservation); the host needs only the driver.

ARG TORCH_VERSION=2.11.0

# --- build stages -------------------------------------------------------------------------
FROM rust:1-bookworm AS build-base
WORKDIR /src
COPY . .

FROM build-base AS build-server
RUN cargo build --profile dist --locked \
    && install -m 0755 target/dist/app /usr/local/bin/app

# The trainer links libtorch from the PyPI wheel (the version tch is built for), installed in a
# venv at the same path the worker image uses, so the binary's rpath finds it there too.
FROM build-base AS build-worker
ARG TORCH_VERSION
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" numpy \
    && ln -s "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch" /opt/libtorch
ENV LIBTORCH=/opt/libtorch
RUN cargo build --profile dist --locked --features torch \
    && install -m 0755 target/dist/app /usr/local/bin/app

# --- the head node ------------------------------------------------------------------------
FROM debian:bookworm-slim AS server
# curl for the health check.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-server /usr/local/bin/app /usr/local/bin/app
VOLUME ["/data"]
EXPOSE 8000
ENTRYPOINT ["app"]
CMD ["--server-only", "--bind", "0.0.0.0:8000", "--data-dir", "/data"]

# --- a GPU worker that runs PyTorch code (the default target) -----------------------------
FROM debian:bookworm-slim AS worker
# python3 for the venv (the same Debian Python the build stage used), git for the commit of a
# job's working tree, curl for health checks, procps for a look at running jobs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl git procps python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build-worker /opt/venv /opt/venv
# The path the binary's rpath names (a link into the venv, made again rather than copied).
RUN ln -s "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch" /opt/libtorch
COPY --from=build-worker /usr/local/bin/app /usr/local/bin/app
# Jobs find `python` (with torch) first; the NVIDIA runtime mounts the driver's libraries,
# NVML (`utility`) included, which the worker reads its GPUs from.
ENV PATH=/opt/venv/bin:$PATH \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    PYTHONUNBUFFERED=1
WORKDIR /work
VOLUME ["/work"]
ENTRYPOINT ["app"]
CMD ["--client-only", "--url", "http://server:8000", "--work-dir", "/work"]
