# syntax=docker/dockerfile:1
#
# One image with every Flotilla binary, in /usr/local/bin:
#   flotilla-worker, flotilla-relay, flotilla (the CLI),
#   flotilla-demo-target and flotilla-demo (the demo).
# It runs flotilla-worker unless told otherwise; pick another binary with the
# command (`docker run IMAGE flotilla-relay`, or `command:` in compose).
#
#   docker build -t flotilla:local .
#
# Dependencies are compiled in their own layer (cargo-chef), so a change to
# Flotilla's sources rebuilds only Flotilla's crates. librdkafka is built from
# source against the system's OpenSSL and libcurl (TLS, SASL SCRAM,
# OAUTHBEARER); sqlx and reqwest use rustls with ring.

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---- chef: the toolchain, the C libraries the build links, cargo-chef ----
FROM rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS chef
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      gcc libc6-dev make pkg-config \
      libssl-dev libcurl4-openssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

# ---- planner: the recipe (manifests and Cargo.lock only) ----
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

# ---- builder: dependencies from the recipe (cached), then Flotilla ----
FROM chef AS builder
ARG BINARIES="flotilla-worker flotilla-relay flotilla flotilla-demo-target flotilla-demo"
COPY --from=planner /src/recipe.json recipe.json
RUN set -eu; bins=""; for bin in $BINARIES; do bins="$bins --bin $bin"; done; \
    cargo chef cook --release --locked --recipe-path recipe.json $bins
COPY . .
RUN set -eu; bins=""; for bin in $BINARIES; do bins="$bins --bin $bin"; done; \
    cargo build --release --locked $bins; \
    mkdir -p /out; \
    for bin in $BINARIES; do cp "target/release/$bin" /out/; done

# ---- runtime: the binaries and the shared libraries they load ----
FROM debian:${DEBIAN_RELEASE}-slim AS runtime
ARG DEBIAN_RELEASE
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="flotilla" \
      org.opencontainers.image.description="Flotilla: a durable-workflow worker fleet fed by Kafka (worker, relay, CLI, demo)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:${DEBIAN_RELEASE}-slim"
# libssl3 and libcurl4 for librdkafka; ca-certificates for every TLS client;
# curl for container health checks (GET /readyz), at little cost since
# libcurl4 is here anyway.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 libcurl4 curl \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 flotilla \
 && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin flotilla
COPY --from=builder /out/ /usr/local/bin/
USER 10001:10001
# 8080: the worker's API, health and metrics; 8082: the relay's.
EXPOSE 8080 8082
CMD ["flotilla-worker"]
