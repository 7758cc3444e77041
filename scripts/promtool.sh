#!/usr/bin/env bash
# Prints the path of promtool (Prometheus's rule checker), installing Debian's
# `prometheus` package first if no promtool is on PATH. deploy/'s test runs
# `promtool check rules` on deploy/prometheus/rules.yaml and fails without it;
# scripts/test.sh calls this in its install step, before network isolation.
#
# The package also ships the Prometheus server; nothing starts it: on a
# machine with policy-rc.d (containers) the package's service never starts,
# and the tests only run the promtool binary. RMQTX_PROMTOOL names a promtool
# to use instead (no install then).
set -euo pipefail

if [[ -n ${RMQTX_PROMTOOL:-} ]]; then
  [[ -x $RMQTX_PROMTOOL ]] || { echo "promtool.sh: RMQTX_PROMTOOL=$RMQTX_PROMTOOL is not executable" >&2; exit 1; }
  echo "$RMQTX_PROMTOOL"
  exit 0
fi

if ! command -v promtool >/dev/null; then
  command -v apt-get >/dev/null || { echo "promtool.sh: promtool missing and no apt-get to install it (install Prometheus's promtool and put it on PATH)" >&2; exit 1; }
  echo "promtool.sh: installing promtool from Debian's package prometheus" >&2
  export DEBIAN_FRONTEND=noninteractive
  sudo=
  [[ $(id -u) == 0 ]] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v promtool >/dev/null || { echo "promtool.sh: package prometheus installed but promtool not found" >&2; exit 1; }
fi
command -v promtool
