# syntax=docker/dockerfile:1
# Multi-stage build of `app`. FEATURES enables cargo features, e.g. the built-in trainer
# later: docker compose build --build-arg FEATURES=torch
FROM rust:1-bookworm AS build
ARG FEATURES=""
WORKDIR /src
COPY . .
RUN cargo build --release --locked ${FEATURES:+--features "$FEATURES"} \
    && cp target/release/app /usr/local/bin/app

FROM debian:bookworm-slim
# curl for the healthcheck, git for the commit of a job's working tree, python3 for jobs.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl git python3 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/app /usr/local/bin/app
VOLUME ["/data", "/work"]
EXPOSE 8000
ENTRYPOINT ["app"]
CMD ["--server-only", "--bind", "0.0.0.0:8000", "--data-dir", "/data"]
