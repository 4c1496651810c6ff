# syntax=docker/dockerfile:1
#
# The rate limit service as a static binary on distroless, running as nonroot.
#
#   docker build -t ratelimit .
#   docker run --rm -p 8081:8081 -p 8080:8080 ratelimit     # embedded store: a demo
#   docker run --rm ratelimit --config /etc/ratelimit/config --redis-url redis://redis:6379/0
#   docker run --rm -e REDIS_SOCKET_TYPE=tcp -e REDIS_URL=redis:6379 ratelimit   # envoyproxy/ratelimit's variables
#
# Multi-platform: docker buildx build --platform linux/amd64,linux/arm64 .
# deploy/image_test.go runs the go build line below, flags as written here, and
# checks the result is static and accepts deploy/config.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
ARG TARGETOS TARGETARCH
WORKDIR /src
# Modules first: this layer is rebuilt only when go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# Static (no cgo: distroless/static has no libc), reproducible paths, no
# symbol table or DWARF.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ratelimit ./cmd/ratelimit
# /ratelimit, the path of earlier images, as a link to /bin/ratelimit: copied
# as the content of a directory, a link stays a link (no second binary).
RUN mkdir -p /out/root && ln -s /bin/ratelimit /out/root/ratelimit

FROM gcr.io/distroless/static-debian12:nonroot
# /bin/ratelimit, as envoyproxy/ratelimit's image: deployments that run it
# (Envoy Gateway's, Istio's sample) switch by changing the image.
COPY --from=build /out/ratelimit /bin/ratelimit
COPY --from=build /out/root/ /
# The example rules of deploy/config, so that the image runs as is. In
# Kubernetes a ConfigMap is mounted over this directory (deploy/k8s). The
# path is the default of last resort: --config, RATELIMIT_CONFIG and
# envoyproxy/ratelimit's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY all win over it.
COPY deploy/config/*.yaml /etc/ratelimit/config/
ENV RATELIMIT_DEFAULT_CONFIG=/etc/ratelimit/config
# 8081: gRPC (envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1,
#       reflection), for Envoy. 8080: HTTP GET /healthz, /readyz and /healthcheck, for probes.
# Neither needs to be reachable from outside the cluster or host.
EXPOSE 8081 8080
USER nonroot
ENTRYPOINT ["/bin/ratelimit"]
