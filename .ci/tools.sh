#!/usr/bin/env bash
# Installs the code generators at the versions the committed generated code
# was made with, so that CI, `make proto` and proto/generate_test.go agree,
# and the test tools at pinned versions:
#
#   protoc              3.21.12  Debian 12's protobuf-compiler, with
#                                libprotobuf-dev for the well-known types
#   protoc-gen-go       google.golang.org/protobuf's version in go.mod
#   protoc-gen-go-grpc  PROTOC_GEN_GO_GRPC_VERSION below
#   h2spec              H2SPEC_VERSION below: HTTP/2 conformance, run by
#                       internal/grpcunary/h2spec_test.go (which reads the pin
#                       here, as its list of grpc-go's known failures is
#                       that version's)
#
# The Go tools go to GOBIN (default: $(go env GOPATH)/bin). Whatever is
# already there at the right version is left alone.
#
# usage: .ci/tools.sh            install what is missing or at another version
#        .ci/tools.sh --check    install nothing; exit 1 naming what is wrong
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_VERSION=3.21.12
# The newest release; its code needs grpc >= 1.64 (SupportPackageIsVersion9).
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2
# The last release (2019); it has no go.mod, hence +incompatible. Its
# --version says "2.0.0 ((Unknown))" when built by go install: the version
# is read from the binary's module information instead (go version -m).
H2SPEC_VERSION=v2.2.1+incompatible

export PATH="/usr/local/go/bin:$PATH"
gobin="$(go env GOBIN)"
if [ -z "$gobin" ]; then
  gobin="$(go env GOPATH)/bin"
fi
export PATH="$gobin:$PATH"
PROTOC_GEN_GO_VERSION="$(go list -m -f '{{.Version}}' google.golang.org/protobuf)"

check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

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
    protoc-gen-go) protoc-gen-go --version 2>/dev/null | sed -n 's/^protoc-gen-go //p' || true ;;
    protoc-gen-go-grpc) protoc-gen-go-grpc --version 2>/dev/null | sed -n 's/^protoc-gen-go-grpc /v/p' || true ;;
    h2spec) module_version "$(command -v h2spec)" github.com/summerwind/h2spec ;;
  esac
}

# has_wkt reports whether protoc finds the well-known types (duration.proto).
has_wkt() {
  local dir
  dir="$(mktemp -d)"
  printf 'syntax = "proto3";\nimport "google/protobuf/duration.proto";\n' >"$dir/wkt.proto"
  protoc -I "$dir" --descriptor_set_out=/dev/null "$dir/wkt.proto" 2>/dev/null
  local rc=$?
  rm -rf "$dir"
  return $rc
}

wrong=()

# ensure NAME WANT INSTALL...: runs INSTALL when NAME does not report WANT.
ensure() {
  local name="$1" want="$2"
  shift 2
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

install_protoc() {
  if ! command -v apt-get >/dev/null; then
    echo "protoc $PROTOC_VERSION is needed: without apt-get, install it by hand (https://github.com/protocolbuffers/protobuf/releases/tag/v21.12)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq protobuf-compiler libprotobuf-dev >/dev/null
}

ensure protoc "$PROTOC_VERSION" install_protoc
if command -v protoc >/dev/null && ! has_wkt; then
  if $check; then
    wrong+=("protoc does not find google/protobuf/duration.proto (Debian: libprotobuf-dev)")
  else
    install_protoc
    has_wkt || { echo "protoc still does not find google/protobuf/duration.proto" >&2; exit 1; }
  fi
fi
ensure protoc-gen-go "$PROTOC_GEN_GO_VERSION" \
  go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
ensure protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" \
  go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"
ensure h2spec "$H2SPEC_VERSION" \
  go install "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION"

if [ ${#wrong[@]} -gt 0 ]; then
  printf '%s\n' "${wrong[@]}" >&2
  echo "run .ci/tools.sh (make tools) to install the code generators and test tools at the pinned versions" >&2
  exit 1
fi
if ! $check; then
  echo "protoc $(version_of protoc), protoc-gen-go $(version_of protoc-gen-go), protoc-gen-go-grpc $(version_of protoc-gen-go-grpc), h2spec $(version_of h2spec) (Go tools in $gobin)"
fi
