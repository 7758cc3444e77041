#!/usr/bin/env bash
# Runs every Go fuzz target in the repo for FUZZTIME (default 10s) each.
# The seed corpora (testdata/fuzz) also run as ordinary tests in `go test`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUZZTIME=${FUZZTIME:-10s}
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r f; do
  pkg=./$(dirname "${f#./}")
  for name in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
    echo "-- $pkg $name"
    go test -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" "$pkg"
  done
done
