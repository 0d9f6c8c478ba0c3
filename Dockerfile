# Multi-stage build: a full Rust toolchain to compile, a small non-root runtime image to run.
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY infergate ./infergate
COPY infergate-sim ./infergate-sim
COPY infergate-loadgen ./infergate-loadgen
# The patched pingora-proxy the workspace uses ([patch.crates-io] in Cargo.toml).
COPY vendor ./vendor
RUN cargo build --release --locked --bin infergate --bin engine-sim \
 && strip target/release/infergate target/release/engine-sim

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin infergate \
 && mkdir -p /etc/infergate /run/infergate && chown infergate:infergate /run/infergate
COPY --from=build /src/target/release/infergate /usr/local/bin/infergate
COPY --from=build /src/target/release/engine-sim /usr/local/bin/engine-sim
COPY conf/infergate.yaml /etc/infergate/infergate.yaml
USER infergate
EXPOSE 8000 9090
ENV RUST_LOG=info
# Listen addresses in the mounted config must be 0.0.0.0:PORT inside a container.
ENTRYPOINT ["/usr/local/bin/infergate"]
CMD ["-c", "/etc/infergate/infergate.yaml"]
