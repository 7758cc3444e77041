#!/usr/bin/env bash
# Raw rocketmq-client-go vs rmqtx, side by side in one run, with ratios
# (issues 8 and 14). Starts the local services if needed, then runs
# cmd/rmqtx-bench: the table goes to stdout, the JSON to $BENCH_JSON (default
# bench-results.json). scripts/bench-durable.sh runs the same against a
# private MariaDB with innodb_flush_log_at_trx_commit=1.
#
#   scripts/bench.sh                                   full run (about 6-8 minutes on 2 cores)
#   scripts/bench.sh -workloads producer -rounds 5     any rmqtx-bench flag (go run ./cmd/rmqtx-bench -h)
#   BENCH_JSON=/tmp/b.json scripts/bench.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

bash scripts/services.sh up
eval "$(bash scripts/services.sh env)"

# The broker's version, from the jar folder services.sh runs it from.
broker_version=$(bash scripts/services.sh status 2>/dev/null | sed -n 's#^jar cache .*/rocketmq-\([^/]*\)/lib$#\1#p' || true)
export RMQTX_ROCKETMQ_VERSION=${broker_version:-${RMQTX_ROCKETMQ_VERSION:-unknown}}
# The transaction-check settings the broker was started with (services.sh defaults).
export RMQTX_TX_TIMEOUT_MS=${RMQTX_TX_TIMEOUT_MS:-3000}
export RMQTX_TX_CHECK_INTERVAL_MS=${RMQTX_TX_CHECK_INTERVAL_MS:-2000}
export RMQTX_TX_CHECK_MAX=${RMQTX_TX_CHECK_MAX:-5}

json=${BENCH_JSON:-bench-results.json}
go run ./cmd/rmqtx-bench -json "$json" "$@"
