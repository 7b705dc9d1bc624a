# The node agent, `tessera`: lazy FUSE mounts, the verified chunk cache, peer-to-peer
# and the registry mirror. Build from the repository root:
#   docker build -f deploy/docker/tessera.Dockerfile -t tessera:dev .
# It runs as root: mounting FUSE filesystems for other containers needs CAP_SYS_ADMIN
# and /dev/fuse (the Helm chart grants exactly that to the agent's DaemonSet).

# The toolchain the tests run with (the workspace needs 1.88 or newer).
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tessera-agent --bin tessera \
    && strip target/release/tessera

FROM docker.io/library/debian:bookworm-slim
# fuse3: fusermount3 for unmounting; ca-certificates: TLS registries.
RUN apt-get update \
    && apt-get install -y --no-install-recommends fuse3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/tessera /usr/local/bin/tessera
# The cache lives on a hostPath in Kubernetes so it survives pod restarts.
VOLUME ["/var/lib/tessera"]
ENV TESSERA_CACHE_DIR=/var/lib/tessera/cache
ENTRYPOINT ["/usr/local/bin/tessera"]
CMD ["agent"]
