#!/usr/bin/env bash
# Installs what `make test` needs, at pinned versions, so that CI, `make
# proto`, `make lint` and the tests agree:
#
#   redis               redis-server, redis-cli and redis-sentinel (Debian's
#                       redis-server and redis-sentinel packages): the e2e
#                       tests start their own standalone, cluster and
#                       sentinel processes
#   lua                 Lua 5.1's C library and headers (Debian's
#                       liblua5.1-0-dev, found by pkg-config): the
#                       interpreter Redis embeds, which internal/luastore
#                       runs the scripts in for the simulator (cgo)
#   protoc              3.21.12  Debian 12's protobuf-compiler, with
#                                libprotobuf-dev for the well-known types
#   promtool            2.42.0   Debian 12's prometheus package: checks and
#                                unit-tests deploy/monitoring's alert rules
#                                (its monitoring_test.go); the package's
#                                Prometheus server is stopped and disabled
#   protoc-gen-go       google.golang.org/protobuf's version in go.mod
#   protoc-gen-go-grpc  PROTOC_GEN_GO_GRPC_VERSION below
#   h2spec              H2SPEC_VERSION below: HTTP/2 conformance, run by
#                       internal/grpcunary/h2spec_test.go (which reads the pin
#                       here, as its list of grpc-go's known failures is
#                       that version's)
#   golangci-lint       GOLANGCI_LINT_VERSION below: `make lint`
#                       (.golangci.yml)
#   apidiff             APIDIFF_VERSION below: `make api`, the public API
#                       against its baseline in api/
#
# The packages come from apt-get (as root, or with sudo when it needs no
# password); elsewhere the script stops and says what to install. The Go
# tools go to GOBIN (default: $(go env GOPATH)/bin). Whatever is already
# there at the right version is left alone: with everything present this is
# a check of about a second.
#
# usage: .ci/tools.sh [--check] [TOOL...]
#   TOOL: redis, lua, protoc, promtool, protoc-gen-go, protoc-gen-go-grpc,
#         h2spec, golangci-lint, apidiff (default: all of them)
#   --check: install nothing; exit 1 naming what is wrong
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_VERSION=3.21.12
# Debian 12's prometheus (2.42.0+ds-5+deb12u1); its promtool reports
# 2.42.0+ds, upstream's 2.42.0: the +ds (sources repacked) is dropped.
PROMTOOL_VERSION=2.42.0
# The newest release; its code needs grpc >= 1.64 (SupportPackageIsVersion9).
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
# The last release (2019); it has no go.mod, hence +incompatible. Its
# --version says "2.0.0 ((Unknown))" when built by go install: the version
# is read from the binary's module information instead (go version -m).
H2SPEC_VERSION=v2.2.1+incompatible
# Read from the binary's module information too, as h2spec's.
GOLANGCI_LINT_VERSION=v2.15.0
# golang.org/x/exp has no releases: a pseudo-version, read as golangci-lint's.
APIDIFF_VERSION=v0.0.0-20261113113407-e3970619a1a4

export PATH="/usr/local/go/bin:$PATH"
gobin="$(go env GOBIN)"
if [ -z "$gobin" ]; then
  gobin="$(go env GOPATH)/bin"
fi
export PATH="$gobin:$PATH"

all=(redis lua protoc promtool protoc-gen-go protoc-gen-go-grpc h2spec golangci-lint apidiff)
check=false
tools=()
for arg in "$@"; do
  case "$arg" in
    --check) check=true ;;
    redis | lua | protoc | promtool | protoc-gen-go | protoc-gen-go-grpc | h2spec | golangci-lint | apidiff) tools+=("$arg") ;;
    *) echo "usage: $0 [--check] [TOOL...], TOOL one of: ${all[*]}" >&2; exit 2 ;;
  esac
done
if [ ${#tools[@]} -eq 0 ]; then
  tools=("${all[@]}")
fi
wanted() {
  local t
  for t in "${tools[@]}"; do
    [ "$t" = "$1" ] && return 0
  done
  return 1
}

# module_version BINARY MODULE prints the version of MODULE that BINARY was
# built from; "PATH@VERSION" when it was built from another module (empty
# when not by go).
module_version() {
  go version -m "$1" 2>/dev/null | awk -v m="$2" '$1 == "mod" { print ($2 == m ? $3 : $2 "@" $3); exit }' || true
}

# version_of prints the version a tool reports, empty when it is missing.
version_of() {
  command -v "$1" >/dev/null || return 0
  case "$1" in
    protoc) protoc --version 2>/dev/null | sed -n 's/^libprotoc //p' || true ;;
    promtool) promtool --version 2>/dev/null | sed -n 's/^promtool, version \([^ +]*\).*/\1/p' || true ;;
    protoc-gen-go) protoc-gen-go --version 2>/dev/null | sed -n 's/^protoc-gen-go //p' || true ;;
    protoc-gen-go-grpc) protoc-gen-go-grpc --version 2>/dev/null | sed -n 's/^protoc-gen-go-grpc /v/p' || true ;;
    h2spec) module_version "$(command -v h2spec)" github.com/summerwind/h2spec ;;
    golangci-lint) module_version "$(command -v golangci-lint)" github.com/golangci/golangci-lint/v2 ;;
    apidiff) module_version "$(command -v apidiff)" golang.org/x/exp ;;
  esac
}

# has_wkt reports whether protoc finds the well-known types (duration.proto).
has_wkt() {
  local dir
  dir="$(mktemp -d)"
  printf 'syntax = "proto3";\nimport "google/protobuf/duration.proto";\n' >"$dir/wkt.proto"
  local rc=0
  protoc -I "$dir" --descriptor_set_out=/dev/null "$dir/wkt.proto" 2>/dev/null || rc=$?
  rm -rf "$dir"
  return $rc
}

wrong=()

# The system packages first, all in one apt-get: without them the script
# stops before the slower go installs.
packages=()    # Debian packages to install
need=()        # what they provide, named where there is no apt-get
redis_ok() {
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v redis-sentinel >/dev/null
}
if wanted redis && ! redis_ok; then
  for c in redis-server redis-cli redis-sentinel; do
    command -v "$c" >/dev/null || wrong+=("$c is missing")
  done
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null || packages+=(redis-server)
  command -v redis-sentinel >/dev/null || packages+=(redis-sentinel)
  need+=("redis-server, redis-cli and redis-sentinel")
fi
if wanted lua && ! pkg-config --exists lua5.1 2>/dev/null; then
  wrong+=("Lua 5.1's C library (pkg-config lua5.1) is missing")
  packages+=(liblua5.1-0-dev pkg-config)
  need+=("Lua 5.1's C library and headers, with a pkg-config file lua5.1")
fi
if wanted protoc; then
  have="$(version_of protoc)"
  if [ "$have" != "$PROTOC_VERSION" ]; then
    wrong+=("protoc is ${have:-missing}, want $PROTOC_VERSION")
    packages+=(protobuf-compiler libprotobuf-dev)
    need+=("protoc $PROTOC_VERSION with its well-known types (https://github.com/protocolbuffers/protobuf/releases/tag/v21.12)")
  elif ! has_wkt; then
    wrong+=("protoc does not find google/protobuf/duration.proto (Debian: libprotobuf-dev)")
    packages+=(libprotobuf-dev)
    need+=("protoc's well-known types (google/protobuf/*.proto)")
  fi
fi

if wanted promtool; then
  have="$(version_of promtool)"
  if [ "$have" != "$PROMTOOL_VERSION" ]; then
    wrong+=("promtool is ${have:-missing}, want $PROMTOOL_VERSION")
    packages+=(prometheus)
    need+=("promtool $PROMTOOL_VERSION (https://github.com/prometheus/prometheus/releases/tag/v$PROMTOOL_VERSION)")
  fi
fi

# stop_prometheus_server stops the Prometheus server that Debian's package
# starts where an init system runs services (systemd; sysvinit without a
# policy-rc.d that forbids it, as containers have), and keeps it from
# starting at boot: only its promtool is wanted.
stop_prometheus_server() {
  if [ -d /run/systemd/system ]; then
    "${as_root[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/prometheus ]; then
    "${as_root[@]}" /etc/init.d/prometheus stop >/dev/null 2>&1 || true
    "${as_root[@]}" update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
}

if [ ${#packages[@]} -gt 0 ] && ! $check; then
  printf '%s\n' "${wrong[@]}" >&2
  wrong=()
  if ! command -v apt-get >/dev/null; then
    echo "This machine has no apt-get (Debian, Ubuntu), so nothing was installed. Install:" >&2
    printf '  %s\n' "${need[@]}" >&2
    echo "then run make test again." >&2
    exit 1
  fi
  if [ "$(id -u)" -eq 0 ]; then
    as_root=(env)
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n env)
  else
    echo "Installing packages needs root. Run this, then make test again:
  sudo apt-get update && sudo apt-get install -y ${packages[*]}" >&2
    exit 1
  fi
  echo "installing ${packages[*]} (apt-get)" >&2
  "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get update -qq
  # Without recommends: prometheus's is prometheus-node-exporter, one more
  # server (protobuf-compiler's, libprotobuf-dev, is asked for by name).
  "${as_root[@]}" DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-upgrade --no-install-recommends "${packages[@]}" >/dev/null
  if wanted redis && ! redis_ok; then
    echo "apt-get installed ${packages[*]}, but redis-server, redis-cli or redis-sentinel is still not on PATH" >&2
    exit 1
  fi
  if wanted lua && ! pkg-config --exists lua5.1; then
    echo "apt-get installed ${packages[*]}, but pkg-config still finds no lua5.1" >&2
    exit 1
  fi
  if wanted protoc; then
    have="$(version_of protoc)"
    if [ "$have" != "$PROTOC_VERSION" ]; then
      echo "apt-get's protoc is ${have:-missing}, want $PROTOC_VERSION (Debian 12's): install protoc $PROTOC_VERSION from https://github.com/protocolbuffers/protobuf/releases/tag/v21.12" >&2
      exit 1
    fi
    has_wkt || { echo "protoc still does not find google/protobuf/duration.proto" >&2; exit 1; }
  fi
  if wanted promtool; then
    if [[ " ${packages[*]} " == *" prometheus "* ]]; then
      stop_prometheus_server
    fi
    have="$(version_of promtool)"
    if [ "$have" != "$PROMTOOL_VERSION" ]; then
      echo "apt-get's promtool is ${have:-missing}, want $PROMTOOL_VERSION (Debian 12's): install promtool $PROMTOOL_VERSION from https://github.com/prometheus/prometheus/releases/tag/v$PROMTOOL_VERSION" >&2
      exit 1
    fi
  fi
fi

# ensure NAME WANT INSTALL...: runs INSTALL when NAME does not report WANT.
ensure() {
  local name="$1" want="$2"
  shift 2
  wanted "$name" || return 0
  local have
  have="$(version_of "$name")"
  if [ "$have" = "$want" ]; then
    return
  fi
  if $check; then
    wrong+=("$name is ${have:-missing}, want $want")
    return
  fi
  echo "installing $name $want (have: ${have:-none})" >&2
  "$@"
  have="$(version_of "$name")"
  if [ "$have" != "$want" ]; then
    echo "$name: installed, but it reports ${have:-nothing} (at $(command -v "$name" || echo 'no path')), want $want" >&2
    exit 1
  fi
}

if wanted protoc-gen-go; then
  PROTOC_GEN_GO_VERSION="$(go list -m -f '{{.Version}}' google.golang.org/protobuf)"
  ensure protoc-gen-go "$PROTOC_GEN_GO_VERSION" \
    go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
fi
ensure protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" \
  go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
ensure h2spec "$H2SPEC_VERSION" \
  go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION"
ensure golangci-lint "$GOLANGCI_LINT_VERSION" \
  go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
ensure apidiff "$APIDIFF_VERSION" \
  go install "golang.org/x/exp/cmd/apidiff@$APIDIFF_VERSION"

if [ ${#wrong[@]} -gt 0 ]; then
  printf '%s\n' "${wrong[@]}" >&2
  echo "run .ci/tools.sh (make tools) to install them at the pinned versions" >&2
  exit 1
fi
