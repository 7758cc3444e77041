#!/usr/bin/env bash
# The user's build: go.mod without its `replace` of rocketmq-client-go, as a
# -modfile view. A replace applies only when rmqtx is the main module, so a
# service that imports rmqtx builds against the upstream client at the pinned
# version; `make test` and `make bench` use this view to prove and measure
# what such a service gets.
#
#   scripts/upstream-mod.sh          write the view and print its path (.run/upstream/go.mod)
#   go build -modfile="$(scripts/upstream-mod.sh)" ./...
#
# The view is generated from go.mod on every call, so it can never drift from
# it; it is not tracked. Its go.sum is go.sum plus the upstream module's two
# hashes recorded in third_party/rocketmq-client-go/UPSTREAM (the ones
# scripts/client-patch.sh verifies the patched copy against), so it trusts
# nothing new. Downloading the module needs the network once; later calls
# use the module cache. RMQTX_UPSTREAM_MODFILE overrides the path.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
mod=$(awk '$1=="module"{print $2}' third_party/rocketmq-client-go/UPSTREAM)
out=${RMQTX_UPSTREAM_MODFILE:-$ROOT/.run/upstream/go.mod}
sum=${out%.mod}.sum
mkdir -p "$(dirname "$out")"

# Written under temporary names and moved into place at the end: a run that
# reads the view meanwhile sees the old one or the new one, never half.
cp go.mod "$out.tmp.mod"
cp go.sum "$out.tmp.sum"
# go reads the go.sum of -modfile=X.mod from X.sum.
go mod edit -modfile="$out.tmp.mod" -dropreplace="$mod"
if grep -q '^replace' "$out.tmp.mod"; then
  echo "upstream-mod: go.mod has a replace besides $mod; the view would not be the user's build:" >&2
  grep '^replace' "$out.tmp.mod" >&2
  exit 1
fi
awk '$1=="h1"||$1=="h1mod"{$1=""; sub(/^ /,""); print}' third_party/rocketmq-client-go/UPSTREAM >>"$out.tmp.sum"
# Verified against those hashes; no checksum database is consulted.
GOFLAGS=-mod=mod GONOSUMDB="$mod" go mod download -modfile="$out.tmp.mod" "$mod" >/dev/null
# Every package of the module must resolve in the view (a missing go.sum line
# fails here, not halfway through a test run).
go list -modfile="$out.tmp.mod" -deps -test -tags failpoints ./... >/dev/null
mv "$out.tmp.sum" "$sum"
mv "$out.tmp.mod" "$out"
echo "$out"
