# syntax=docker/dockerfile:1
#
# The rate limit service as a static binary on distroless, running as nonroot.
#
#   docker build -t ratelimit .
#   docker run --rm -p 8081:8081 -p 8080:8080 ratelimit     # embedded store: a demo
#   docker run --rm ratelimit --config /etc/ratelimit/config --redis-url redis://redis:6379/0
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

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ratelimit /ratelimit
# The example rules of deploy/config, so that the image runs as is. In
# Kubernetes a ConfigMap is mounted over this directory (deploy/k8s).
COPY deploy/config/*.yaml /etc/ratelimit/config/
# 8081: gRPC (envoy.service.ratelimit.v3.RateLimitService, grpc.health.v1,
#       reflection), for Envoy. 8080: HTTP GET /healthz and /readyz, for probes.
# Neither needs to be reachable from outside the cluster or host.
EXPOSE 8081 8080
USER nonroot
ENTRYPOINT ["/ratelimit"]
CMD ["--config", "/etc/ratelimit/config"]
