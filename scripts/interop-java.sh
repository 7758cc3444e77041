#!/usr/bin/env bash
# Builds the Java interop programs (interop/java) into the cache, once per
# version of their sources:
#
#   scripts/interop-java.sh          build if needed, print the build folder
#   scripts/interop-java.sh path     print the build folder (built or not)
#
# The build folder is $RMQTX_CACHE_DIR/interop-java/<hash of pom.xml and the
# .java files>; it holds lib/ (rocketmq-client and its dependencies, fetched by
# `mvn dependency:copy-dependencies` like scripts/services.sh fetches the
# broker) and classes/ (javac). A second run with the same sources is a no-op
# and needs no network. The Go tests in interop/ compute the same hash and
# fail, saying to run this script, when the folder is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${RMQTX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmqtx}
SRC=interop/java

log() { printf '[interop-java] %s\n' "$*" >&2; }
die() { printf '[interop-java] ERROR: %s\n' "$*" >&2; exit 1; }

# sources: pom.xml and every .java file under src/, sorted bytewise, as paths
# relative to the repository root (interop/hash_test.go mirrors this).
sources() {
  (cd "$ROOT" && { echo "$SRC/pom.xml"; find "$SRC/src" -type f -name '*.java'; } | LC_ALL=C sort)
}

source_hash() {
  (cd "$ROOT" && sources | while IFS= read -r f; do sha256sum "$f"; done | sha256sum | cut -c1-16)
}

OUT=$CACHE_DIR/interop-java/$(source_hash)
if [[ ${1:-} == path ]]; then
  echo "$OUT"
  exit 0
fi
if [[ -f $OUT/.complete ]]; then
  echo "$OUT"
  exit 0
fi

command -v java >/dev/null || die "java is required (OpenJDK 17)"
command -v javac >/dev/null || die "javac is required (OpenJDK 17 JDK)"
command -v mvn >/dev/null || die "Maven (mvn) is required to fetch rocketmq-client"

log "building $SRC into $OUT"
TMP=$OUT.tmp.$$
rm -rf "$TMP"
mkdir -p "$TMP/lib" "$TMP/classes"
trap 'rm -rf "$TMP"' EXIT
mvn -q -B -Dstyle.color=never -f "$ROOT/$SRC/pom.xml" dependency:copy-dependencies \
  -DoutputDirectory="$TMP/lib" -DincludeScope=runtime >&2 \
  || die "mvn could not fetch rocketmq-client (see above)"
ls "$TMP"/lib/rocketmq-client-*.jar >/dev/null 2>&1 || die "rocketmq-client jar missing after mvn"
mapfile -t JAVA_FILES < <(sources | grep '\.java$' | sed "s|^|$ROOT/|")
javac -nowarn --release 17 -encoding UTF-8 -cp "$TMP/lib/*" -d "$TMP/classes" "${JAVA_FILES[@]}" \
  || die "javac failed"
touch "$TMP/.complete"
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
log "built: $OUT"
echo "$OUT"
