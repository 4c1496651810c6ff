#!/usr/bin/env bash
# The public API against its committed baseline (api/*.export, apidiff's
# export data): an incompatible change to a package a user imports (pkg/...,
# scripts/lua) fails, and so does a public package without a baseline.
#
# usage: .ci/api.sh          check
#        .ci/api.sh --write  write the baseline anew (a deliberate API change,
#                            or a compatible addition to record)
set -euo pipefail
cd "$(dirname "$0")/.."

write=false
case "${1:-}" in
  --write) write=true ;;
  "") ;;
  *) echo "usage: $0 [--write]" >&2; exit 2 ;;
esac

module="$(go list -m)"
failed=false
for pkg in $(go list ./pkg/... ./scripts/lua); do
  rel="${pkg#"$module"/}"
  baseline="api/${rel//\//_}.export"
  if $write; then
    apidiff -w "$baseline" "$pkg"
    continue
  fi
  if [ ! -f "$baseline" ]; then
    echo "$rel: public package without an API baseline: run .ci/api.sh --write and commit $baseline" >&2
    failed=true
    continue
  fi
  changes="$(apidiff -incompatible "$baseline" "$pkg")"
  if [ -n "$changes" ]; then
    printf '%s: incompatible API change against %s:\n%s\n' "$rel" "$baseline" "$changes" >&2
    failed=true
  fi
done
if $failed; then
  echo "A break of the public API is a decision: make it compatible, or record it with .ci/api.sh --write." >&2
  exit 1
fi
