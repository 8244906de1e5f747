# payonce's image: one binary for `payonce serve`, `payonce sweep`, `payonce stripe-sim` and the
# admin commands, run as an unprivileged user on a slim Debian.
#
#   docker compose build                        compile from source (the `build` stage), then the runtime
#   docker build --target prebuilt -f Dockerfile DIR
#                                               no compiler: DIR holds a Linux `payonce` binary (built
#                                               for glibc ≤ bookworm's) and docker/http-ok; CI's shortcut
#                                               (.ci/compose-smoke), which runs the same runtime stage
#
# Needs BuildKit (the default builder of Docker ≥ 23 and of Compose v2) for the cache mounts: the
# crates and the target folder survive between builds, so editing payonce recompiles only payonce.
# SQL is checked against the committed .sqlx/ metadata (SQLX_OFFLINE in .cargo/config.toml), so the
# build needs no database.

ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# The registry and target caches are BuildKit cache mounts, not layers: they are kept by the
# builder between builds and never end up in an image. The binary is copied out of the mounted
# target folder. Release profile, without its line tables (a smaller image; symbols stay, so a
# backtrace still names functions).
RUN --mount=type=cache,id=payonce-cargo-registry,target=/usr/local/cargo/registry \
    --mount=type=cache,id=payonce-cargo-git,target=/usr/local/cargo/git \
    --mount=type=cache,id=payonce-target,target=/src/target \
    CARGO_PROFILE_RELEASE_STRIP=debuginfo cargo build --release --locked -p payonce --bin payonce \
    && install -m 0755 target/release/payonce /usr/local/bin/payonce

FROM ${RUNTIME_IMAGE} AS runtime
# No curl, no CA bundle: payonce's TLS roots are compiled in (webpki-roots), and the health probe
# is a few lines of bash (docker/http-ok).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin payonce
COPY docker/http-ok /usr/local/bin/http-ok
ENV PAYONCE_ADDR=0.0.0.0:3000 \
    PAYONCE_LOG_FORMAT=json
EXPOSE 3000
# /readyz: the database answers (503 otherwise). The simulator's service overrides the path.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 CMD ["http-ok", "/readyz"]
USER payonce
# payonce is PID 1 and handles SIGTERM itself: it stops accepting, lets requests and the current
# sweeper pass finish, flushes the event log and exits (docs/operations.md: the stop time).
ENTRYPOINT ["payonce"]
CMD ["serve"]

# CI's shortcut: the same runtime with a binary built outside (see the top of this file).
FROM runtime AS prebuilt
COPY payonce /usr/local/bin/payonce

# The default, last stage: the binary compiled by the build stage.
FROM runtime AS release
COPY --from=build /usr/local/bin/payonce /usr/local/bin/payonce
