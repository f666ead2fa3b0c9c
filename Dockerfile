# delayq: `delayq serve` in a small Debian image, as a non-root user (OCI; Docker and Podman).
#
#   docker build -t delayq .            # builds the binary from source (the Rust stage)
#   podman build --format docker -t delayq .     # the same; --format docker keeps the HEALTHCHECK
#
# A binary built elsewhere (same glibc as Debian bookworm or older), e.g. by CI:
#
#   docker build --target prebuilt --build-arg DELAYQ_BINARY=target/release/delayq -t delayq .
#
# Run it with a mounted config and DELAYQ_* variables (docs/container.md):
#
#   docker run -p 127.0.0.1:7070:7070 -v ./delayq.toml:/etc/delayq/delayq.toml:ro \
#     -e DELAYQ_REDIS_URL=redis://redis:6379 delayq
#
# Stages: runtime-base (Debian slim, CA certificates, the user, health check), prebuilt
# (runtime-base + a binary from the build context + labels), build (cargo), runtime
# (runtime-base + the binary from build + labels; the default, last stage).

ARG RUST_VERSION=1.95
ARG DEBIAN_RELEASE=bookworm

# ---------------------------------------------------------------------------------------
FROM docker.io/library/debian:${DEBIAN_RELEASE}-slim AS runtime-base

# CA certificates: rediss:// and https:// webhooks verify against the system store. Nothing
# else is added: no curl, no wget, no compiler. Apt's lists are removed in the same layer.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
 && groupadd --system --gid 10001 delayq \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin delayq

# The default configuration: listen on every interface of the container, everything else
# the defaults. Mount your own over it, and/or set DELAYQ_* variables (DELAYQ_REDIS_URL,
# DELAYQ_HTTP__TOKENS='["..."]', DELAYQ_HANDLERS=..., see docs/container.md).
COPY --chmod=0644 deploy/docker/delayq.toml /etc/delayq/delayq.toml

# No RUST_LOG: serve's default is delayq's own lines from info, the dependencies' warnings.
ENV NO_COLOR=1

# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /tmp
EXPOSE 7070
# delayq handles SIGTERM itself (it is PID 1 here): no new work, running handlers finish
# within shutdown_grace (default 10s), exit 0. Give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
# The health probe: `delayq healthcheck` asks serve's /healthz at the address serve reads
# from the same file and DELAYQ_* variables (DELAYQ_HTTP__LISTEN); exit 0 or 1, one line.
# No HTTP client is added to the image for it. `--format docker` keeps it under podman.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
  CMD ["/usr/local/bin/delayq", "healthcheck", "--config", "/etc/delayq/delayq.toml", "--timeout", "3s"]
ENTRYPOINT ["/usr/local/bin/delayq"]
CMD ["serve", "--config", "/etc/delayq/delayq.toml"]

# ---------------------------------------------------------------------------------------
# A binary built outside (CI, a cross build): --target prebuilt --build-arg DELAYQ_BINARY=...
# (a path inside the build context; .dockerignore lets target/release/delayq through).
FROM runtime-base AS prebuilt
ARG DELAYQ_BINARY=target/release/delayq
COPY --chmod=0755 ${DELAYQ_BINARY} /usr/local/bin/delayq
RUN ["/usr/local/bin/delayq", "--version"]
# The OCI labels, in each final stage (so runtime-base stays the same from build to build).
ARG DEBIAN_RELEASE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="delayq" \
      org.opencontainers.image.description="Order-expiry delay queue on Redis: delayq serve (HTTP API, dispatchers, webhook and order-close handlers, dashboard)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:${DEBIAN_RELEASE}-slim"

# ---------------------------------------------------------------------------------------
FROM docker.io/library/rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
WORKDIR /src
COPY . .
# The cache mounts keep the crates and the target directory between builds (BuildKit and
# Buildah). Debug info is stripped (function names stay, for backtraces).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    CARGO_PROFILE_RELEASE_STRIP=debuginfo cargo build --release --locked --bin delayq --no-default-features --features cli \
 && install -D -m 0755 target/release/delayq /out/delayq

# ---------------------------------------------------------------------------------------
# The default: built from source.
FROM runtime-base AS runtime
COPY --from=build /out/delayq /usr/local/bin/delayq
RUN ["/usr/local/bin/delayq", "--version"]
# The OCI labels, in each final stage (so runtime-base stays the same from build to build).
ARG DEBIAN_RELEASE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="delayq" \
      org.opencontainers.image.description="Order-expiry delay queue on Redis: delayq serve (HTTP API, dispatchers, webhook and order-close handlers, dashboard)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="MIT OR Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:${DEBIAN_RELEASE}-slim"
