# Build stage: the release binary.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# jemalloc's compiled-in options (a background purge thread).
COPY .cargo ./.cargo
COPY src ./src
COPY benches ./benches
# Without the demo and its embedded data: the proxy alone.
RUN cargo build --release --locked --no-default-features --bin shedgate

# Run stage: the binary, the example policy, a non-root user.
FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home shedgate
COPY --from=build /src/target/release/shedgate /usr/local/bin/shedgate
COPY policies /etc/shedgate/policies
USER 10001
EXPOSE 8080 9901
# SHEDGATE_UPSTREAM must be set (e.g. http://ingest:3000).
ENTRYPOINT ["/usr/local/bin/shedgate"]
CMD ["serve", "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9901", "--policies", "/etc/shedgate/policies"]
