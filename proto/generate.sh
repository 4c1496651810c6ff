#!/usr/bin/env bash
# Generates the Go code of every .proto file under proto/, next to it (or
# under OUT_DIR, with the same layout): `make proto` runs it as is, and
# proto/generate_test.go runs it into a temporary directory and compares.
#
# usage: proto/generate.sh [OUT_DIR]
#
# The tools must be at the versions .ci/tools.sh pins: the generated files
# record them, and another version generates other bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-proto}"

export PATH="/usr/local/go/bin:$PATH"
gobin="$(go env GOBIN)"
if [ -z "$gobin" ]; then
  gobin="$(go env GOPATH)/bin"
fi
export PATH="$gobin:$PATH"

.ci/tools.sh --check protoc protoc-gen-go protoc-gen-go-grpc

mkdir -p "$out"
find proto -name '*.proto' -print0 | sort -z | xargs -0 \
  protoc -I proto \
    --go_out="$out" --go_opt=paths=source_relative \
    --go-grpc_out="$out" --go-grpc_opt=paths=source_relative
