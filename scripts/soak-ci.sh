#!/usr/bin/env bash
# Proof of stability (issue 12): runs CI's command (.ci/run, i.e. `make test`)
# on a fresh clone of this repository RUNS times in a row, with a CPU hog of
# HOG busy loops running beside it the whole time, and prints one line per
# run: result, duration, load average. It stops at the first red run unless
# KEEP_GOING=1. Each clone starts with no .run folder and no services; the
# jar cache, the Go caches and the installed MariaDB are the machine's, as on
# a CI machine's second run.
#
#   scripts/soak-ci.sh [RUNS] [HOG]        defaults: 5 runs, 2 busy loops
#   REF=<commit> scripts/soak-ci.sh        soak another commit (default HEAD)
#
# Results go to stdout and to $OUT (default .run/soak/results.txt); each
# run's full log is kept beside it.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${1:-5}
HOG=${2:-2}
REF=${REF:-HEAD}
DIR=${SOAK_DIR:-$ROOT/.run/soak}
OUT=${OUT:-$DIR/results.txt}
mkdir -p "$DIR"
commit=$(git -C "$ROOT" rev-parse --short "$REF") || exit 2

hogs=()
for _ in $(seq 1 "$HOG"); do
  ( while :; do :; done ) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT

echo "soak: commit $commit, $RUNS runs of .ci/run on a fresh clone, hog: $HOG busy loops (bash 'while :; do :; done'), $(nproc) cores" | tee -a "$OUT"
red=0
for i in $(seq 1 "$RUNS"); do
  clone=$DIR/clone-$i
  rm -rf "$clone"
  git clone -q "$ROOT" "$clone" && git -C "$clone" checkout -q "$commit" || exit 2
  log=$DIR/run-$i.log
  start=$(date -u +%FT%TZ)
  t0=$SECONDS
  (cd "$clone" && .ci/run) >"$log" 2>&1
  rc=$?
  took=$((SECONDS - t0))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  result=PASS
  [[ $rc == 0 ]] || { result="FAIL (exit $rc)"; red=$((red + 1)); }
  faults=$(grep -m1 '^==== lost=' "$log" || true)
  printf 'run %d  %s  %s  %dm%02ds  load %s  %s\n' "$i" "$start" "$result" $((took / 60)) $((took % 60)) "$load" "$faults" | tee -a "$OUT"
  rm -rf "$clone"
  if [[ $rc != 0 && ${KEEP_GOING:-0} != 1 ]]; then
    echo "soak: stopped at the first red run; log: $log" | tee -a "$OUT"
    exit 1
  fi
done
echo "soak: $((RUNS - red)) of $RUNS green" | tee -a "$OUT"
[[ $red == 0 ]]
