#!/usr/bin/env bash
# Runs every Go fuzz target in the repo for FUZZTIME each (default 30000x:
# thirty thousand inputs, about 2 to 10 s per target on a 2-core machine).
# The seed corpora (testdata/fuzz) also run as ordinary tests in `go test`.
#
# The default is a count, not a duration, on purpose. With a duration, Go
# 1.26's fuzz coordinator can report "context deadline exceeded" as a failure
# when the time runs out while a worker is busy, with no failing input
# (golang/go#75804, fixed in Go 1.27). A count sets no deadline, so that
# cannot happen, and a real finding still fails the run. A duration such as
# FUZZTIME=60s still works for a longer local run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
FUZZTIME=${FUZZTIME:-30000x}
grep -rl --include='*_test.go' '^func Fuzz' . | while read -r f; do
  pkg=./$(dirname "${f#./}")
  for name in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
    echo "-- $pkg $name"
    go test -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" "$pkg"
  done
done
