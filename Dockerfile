# syntax=docker/dockerfile:1
#
# payonce in two stages: a Rust toolchain builds the release binary (SQL is checked against the
# committed .sqlx/ metadata, so no database is needed to build), and a slim Debian runs it as an
# unprivileged user. The same image serves `payonce serve`, `payonce sweep` and `payonce stripe-sim`.

FROM rust:1.95-bookworm AS build
WORKDIR /src
# Dependencies first, so that editing payonce does not rebuild them: build a stub of each crate.
COPY Cargo.toml Cargo.lock rustfmt.toml ./
COPY .cargo .cargo
COPY app/Cargo.toml app/Cargo.toml
COPY loadtest/Cargo.toml loadtest/Cargo.toml
RUN mkdir -p app/src loadtest/src \
    && echo 'fn main() {}' > app/src/main.rs && touch app/src/lib.rs \
    && echo 'fn main() {}' > loadtest/src/main.rs \
    && cargo build --release --locked -p payonce \
    && rm -rf app/src loadtest/src
COPY . .
# Make cargo see the real sources as newer than the stub's build.
RUN touch app/src/main.rs app/src/lib.rs \
    && cargo build --release --locked -p payonce --bin payonce \
    && cp target/release/payonce /usr/local/bin/payonce

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin payonce
COPY --from=build /usr/local/bin/payonce /usr/local/bin/payonce
USER payonce
ENV PAYONCE_ADDR=0.0.0.0:3000 \
    PAYONCE_LOG_FORMAT=json
EXPOSE 3000
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
    CMD curl -fsS http://127.0.0.1:3000/readyz || exit 1
ENTRYPOINT ["payonce"]
CMD ["serve"]
