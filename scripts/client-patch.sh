#!/usr/bin/env bash
# The patched rocketmq-client-go in third_party/ is the pinned upstream
# version plus third_party/rocketmq-client-go.patch, nothing else.
#
#   scripts/client-patch.sh check [DIR]   verify that DIR (default: the copy in third_party/) is
#                                         exactly that; fails when the folder and the patch disagree
#   scripts/client-patch.sh copy DIR      copy the patched client to DIR (in your service's
#                                         repository) and check the copy
#   scripts/client-patch.sh diff          print the patch from the copy (to refresh the .patch file)
#   scripts/client-patch.sh test [DIR]    run the patches' own tests inside DIR (the client's
#                                         internal package: patch 10), under -race; fails unless
#                                         each of them ran and passed
#
# A service that imports rmqtx builds the upstream client: rmqtx's replace
# applies only when rmqtx is the main module. To build with the patches, run
# `copy` from a checkout of rmqtx at the version you use (the folder has its
# own go.mod, so it is not part of rmqtx's module download), then add
#   go mod edit -replace github.com/apache/rocketmq-client-go/v2=./third_party/rocketmq-client-go
# and keep `check DIR` in your CI. See third_party/rocketmq-client-go/PATCHES.md.
#
# The upstream module comes from the Go module proxy and is verified against
# the hash recorded in third_party/rocketmq-client-go/UPSTREAM.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COPY=third_party/rocketmq-client-go
PATCH=third_party/rocketmq-client-go.patch
# DIR arguments are relative to the caller's directory.
case ${1:-} in
  check | test) DIR=$(cd "${2:-$ROOT/$COPY}" && pwd) ;;
  copy)
    [[ -n ${2:-} ]] || { echo "client-patch: copy needs a destination folder" >&2; exit 2; }
    [[ ! -e $2 || -z $(ls -A "$2") ]] || { echo "client-patch: $2 exists and is not empty" >&2; exit 2; }
    mkdir -p "$2"
    DIR=$(cd "$2" && pwd)
    ;;
  *) DIR=$ROOT/$COPY ;;
esac
cd "$ROOT"
# The patches' tests that live in the client's own packages (they reach
# unexported code), by package and name. make test runs them.
PATCH_TESTS=(./internal:TestCleanOfflineBrokerLeavesReadersAlone)
if [[ ${1:-} == test ]]; then
  for entry in "${PATCH_TESTS[@]}"; do
    pkg=${entry%%:*} name=${entry#*:}
    out=$(cd "$DIR" && go test -race -count=1 -v -run "^${name}\$" "$pkg" 2>&1) || {
      printf '%s\n' "$out" >&2
      echo "client-patch: $name failed in $DIR" >&2
      exit 1
    }
    grep -q -- "^--- PASS: ${name} " <<<"$out" || {
      printf '%s\n' "$out" >&2
      echo "client-patch: $name did not run in $DIR" >&2
      exit 1
    }
    echo "client-patch: $name passed ($pkg, -race)"
  done
  exit 0
fi
if [[ ${1:-} == copy ]]; then
  (cd $COPY && tar cf - .) | (cd "$DIR" && tar xf -)
  chmod -R u+w "$DIR"
fi
mod=$(awk '$1=="module"{print $2}' $COPY/UPSTREAM)
ver=$(awk '$1=="version"{print $2}' $COPY/UPSTREAM)

tmp=$(mktemp -d)
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
# A throwaway module whose go.sum holds the recorded hashes: go mod download
# verifies the download against them, with no checksum database needed.
mkdir -p "$tmp/m"
printf 'module tmp\n\ngo 1.21\n\nrequire %s %s\n' "$mod" "$ver" >"$tmp/m/go.mod"
awk '$1=="h1"||$1=="h1mod"{$1=""; sub(/^ /,""); print}' $COPY/UPSTREAM >"$tmp/m/go.sum"
dir=$(cd "$tmp/m" && GOFLAGS=-mod=mod GONOSUMDB="$mod" go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -d $dir ]] || { echo "client-patch: could not download $mod@$ver" >&2; exit 1; }

mkdir -p "$tmp/a"
(cd "$dir" && find . -type f \( \( -name '*.go' ! -name '*_test.go' \) -o -name go.mod -o -name go.sum -o -name LICENSE -o -name NOTICE \) \
  | grep -v -e '^./examples/' -e '^./benchmark/' -e '^./docs/' | tar cf - -T -) | (cd "$tmp/a" && tar xf -)
mkdir -p "$tmp/b"
(cd "$DIR" && find . -type f ! -name UPSTREAM ! -name PATCHES.md | tar cf - -T -) | (cd "$tmp/b" && tar xf -)
(cd "$tmp" && diff -ruN a b) | sed -E 's/^((---|\+\+\+) [^\t]+)\t.*$/\1/' >"$tmp/patch" || true

case ${1:-} in
  diff) cat "$tmp/patch" ;;
  check | copy)
    if ! cmp -s "$tmp/patch" $PATCH; then
      echo "client-patch: $DIR is not upstream $ver + $PATCH; differences:" >&2
      diff -u $PATCH "$tmp/patch" >&2 || true
      exit 1
    fi
    echo "client-patch: $DIR = upstream $ver + $PATCH ($(grep -c '^@@' $PATCH) hunks)"
    ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
