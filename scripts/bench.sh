#!/usr/bin/env bash
# Raw rocketmq-client-go vs rmqtx, side by side in one run, with ratios
# (issues 8 and 14). Starts the local services if needed, then runs
# cmd/rmqtx-bench: the table goes to stdout, the JSON to $BENCH_JSON (default
# bench-results.json). scripts/bench-durable.sh runs the same against a
# private MariaDB with innodb_flush_log_at_trx_commit=1.
#
# It measures with the upstream client by default: go.mod without its
# replace (scripts/upstream-mod.sh), which is what a service that imports
# rmqtx builds. RMQTX_BENCH_CLIENT=patched measures with the patched copy in
# third_party/ instead (the gain the patches would bring). The table's
# "client:" line and the JSON's machine.client name the client used.
#
# DB picks the database (make bench DB=postgres): mariadb (the default) or
# postgres, the local PostgreSQL of scripts/services.sh (RMQTX_PG_DSN). Both
# sides run on it; the raw sides use its own SQL. The roundtrips workload
# reads MySQL's session counters and is skipped on PostgreSQL.
#
#   scripts/bench.sh                                   full run (about 6-8 minutes on 2 cores)
#   scripts/bench.sh -workloads producer -rounds 5     any rmqtx-bench flag (go run ./cmd/rmqtx-bench -h)
#   DB=postgres scripts/bench.sh                       on PostgreSQL (JSON default: bench-results-postgres.json)
#   RMQTX_BENCH_CLIENT=patched scripts/bench.sh        the patched client
#   BENCH_JSON=/tmp/b.json scripts/bench.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

case ${DB:-mariadb} in
  mariadb | mysql) export RMQTX_BENCH_DB=mysql; json=${BENCH_JSON:-bench-results.json} ;;
  postgres | postgresql | pg) export RMQTX_BENCH_DB=postgres; json=${BENCH_JSON:-bench-results-postgres.json} ;;
  *) echo "bench: DB is mariadb (default) or postgres, not ${DB}" >&2; exit 2 ;;
esac
echo "bench: database ${RMQTX_BENCH_DB}" >&2

bash scripts/services.sh up
eval "$(bash scripts/services.sh env)"

# The broker's version, from the jar folder services.sh runs it from.
broker_version=$(bash scripts/services.sh status 2>/dev/null | sed -n 's#^jar cache .*/rocketmq-\([^/]*\)/lib$#\1#p' || true)
export RMQTX_ROCKETMQ_VERSION=${broker_version:-${RMQTX_ROCKETMQ_VERSION:-unknown}}
# The transaction-check settings the broker was started with (services.sh defaults).
export RMQTX_TX_TIMEOUT_MS=${RMQTX_TX_TIMEOUT_MS:-3000}
export RMQTX_TX_CHECK_INTERVAL_MS=${RMQTX_TX_CHECK_INTERVAL_MS:-2000}
export RMQTX_TX_CHECK_MAX=${RMQTX_TX_CHECK_MAX:-32}

case ${RMQTX_BENCH_CLIENT:-upstream} in
  upstream) view=(-modfile="$(bash scripts/upstream-mod.sh)") ;;
  patched) view=() ;;
  *) echo "bench: RMQTX_BENCH_CLIENT is upstream (default) or patched, not ${RMQTX_BENCH_CLIENT}" >&2; exit 2 ;;
esac
echo "bench: rocketmq-client-go ${RMQTX_BENCH_CLIENT:-upstream}${view:+ (${view[0]})}" >&2

go run "${view[@]}" ./cmd/rmqtx-bench -json "$json" "$@"
