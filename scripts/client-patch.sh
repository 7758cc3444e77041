#!/usr/bin/env bash
# The patched rocketmq-client-go in third_party/ is the pinned upstream
# version plus third_party/rocketmq-client-go.patch, nothing else.
#
#   scripts/client-patch.sh check   verify that (fails when the copy and the patch disagree)
#   scripts/client-patch.sh diff    print the patch from the copy (to refresh the .patch file)
#
# The upstream module comes from the Go module proxy and is verified against
# the hash recorded in third_party/rocketmq-client-go/UPSTREAM.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
COPY=third_party/rocketmq-client-go
PATCH=third_party/rocketmq-client-go.patch
cd "$ROOT"
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
(cd $COPY && find . -type f ! -name UPSTREAM ! -name PATCHES.md | tar cf - -T -) | (cd "$tmp/b" && tar xf -)
(cd "$tmp" && diff -ruN a b) | sed -E 's/^((---|\+\+\+) [^\t]+)\t.*$/\1/' >"$tmp/patch" || true

case ${1:-} in
  diff) cat "$tmp/patch" ;;
  check)
    if ! cmp -s "$tmp/patch" $PATCH; then
      echo "client-patch: $COPY is not upstream $ver + $PATCH; differences:" >&2
      diff -u $PATCH "$tmp/patch" >&2 || true
      exit 1
    fi
    echo "client-patch: $COPY = upstream $ver + $PATCH ($(grep -c '^@@' $PATCH) hunks)"
    ;;
  *) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
