# wxgate's container image.
#
#   docker build -t wxgate:local .
#   docker run --rm -p 127.0.0.1:8080:8080 -p 127.0.0.1:9090:9090 \
#       -e WXGATE_ADMIN_TOKEN="$(openssl rand -hex 16)" \
#       -v wxgate-state:/var/lib/wxgate wxgate:local
#
# The image serves deploy/container.toml (0.0.0.0:8080, admin on
# 0.0.0.0:9090) from /etc/wxgate/wxgate.toml, with the shipped rules.toml
# beside it (/etc/wxgate/rules.toml, which its `rules` names) and
# deploy/rules-wecom.toml (/etc/wxgate/rules-wecom.toml, for its [[domain]]).
# Mount your rules over /etc/wxgate/rules.toml, or your own config over
# /etc/wxgate/wxgate.toml. Any wxgate subcommand runs as its arguments:
#   docker run --rm -v "$PWD/rules.toml:/etc/wxgate/rules.toml:ro" wxgate:local check
#
# Runtime base: distroless/cc (Debian 12): glibc and libgcc_s, which the
# binary links, and nothing else: no shell, no package manager, no curl
# (HEALTHCHECK runs `wxgate probe`). TLS needs no CA bundle
# (rustls with the Mozilla roots built in). Debugging: the `:debug-nonroot`
# tag has a busybox shell. Its Debian release matches the build stage's, so
# the binary finds the glibc it was linked against.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml names the bench target, so cargo wants its file to exist.
COPY benches benches
COPY lua lua
COPY src src
# Cargo.toml's release profile keeps line tables (debug = 1) for profiling;
# the image's binary is built without them and with its symbols stripped
# (73 MB -> 9.3 MB). These variables override the profile for this
# build only.
ENV CARGO_PROFILE_RELEASE_DEBUG=0 \
    CARGO_PROFILE_RELEASE_STRIP=symbols
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin wxgate \
    && install -D -m 0755 target/release/wxgate /out/wxgate \
    && install -d -m 0755 /out/state

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/wxgate /usr/local/bin/wxgate
# Where the embedded store keeps its state ([store] state_file), writable by
# the non-root user; a named volume mounted here starts with this owner.
COPY --from=build --chown=65532:65532 /out/state /var/lib/wxgate
# The config, and the rules files it reads from its own directory.
COPY deploy/container.toml /etc/wxgate/wxgate.toml
COPY rules.toml deploy/rules-wecom.toml /etc/wxgate/
ENV WXGATE_CONFIG=/etc/wxgate/wxgate.toml
# distroless's "nonroot" user, by number so that Kubernetes' runAsNonRoot
# can verify it without reading /etc/passwd.
USER 65532:65532
# The proxy ([server] listen) and the admin listener ([server] admin_listen).
EXPOSE 8080 9090
# /readyz: 200 while wxgate can decide calls (the store reachable, or its
# fallback deciding); 503 when Redis is away and fallback = "deny".
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["wxgate", "probe", "--url", "http://127.0.0.1:9090/readyz", "--timeout", "2s"]
ENTRYPOINT ["wxgate"]
