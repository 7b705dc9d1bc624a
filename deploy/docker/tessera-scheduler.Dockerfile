# The scheduler, `tessera-scheduler`: who holds what, origin single-flight, the admin
# API. Build from the repository root:
#   docker build -f deploy/docker/tessera-scheduler.Dockerfile -t tessera-scheduler:dev .
# It needs no privileges and runs as a non-root user.

# The toolchain the tests run with (the workspace needs 1.88 or newer).
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tessera-scheduler --bin tessera-scheduler \
    && strip target/release/tessera-scheduler

# distroless/cc: glibc and libgcc only, no shell; "nonroot" is uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/tessera-scheduler /usr/local/bin/tessera-scheduler
# The blocklist and preheat jobs (sled), on a PVC when persistence is on.
VOLUME ["/var/lib/tessera-scheduler"]
# gRPC for agents, the admin API.
EXPOSE 7080 7090
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera-scheduler"]
