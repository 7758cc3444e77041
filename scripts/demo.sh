#!/usr/bin/env bash
# The README's main command (`make demo`): start the local services, then run
# the payment-success example end to end and print its summary.
#
#   bash scripts/demo.sh [flags for examples/payment]   e.g. -payments 500
#   bash scripts/demo.sh reconcile [-db NAME]           reconcile a demo database again
#   DB=postgres bash scripts/demo.sh                    the same on PostgreSQL (make demo DB=postgres)
#
# DB is mariadb (the default; mysql is the same) or postgres. Only that
# database and RocketMQ (name server and broker) are started. The exit status
# is the example's: 0 when reconciliation finds no discrepancy, which
# includes `rmqtx stuck`'s query listing nothing once the run is quiescent.
set -euo pipefail
cd "$(dirname "$0")/.."
# The services and go, replaceable by internal/testscript only.
SERVICES=${RMQTX_SERVICES:-bash scripts/services.sh}
GO=${RMQTX_GO:-go}
case ${DB:-mariadb} in
  mariadb | mysql) engine=mysql db=mariadb ;;
  postgres | postgresql | pg) engine=postgres db=postgres ;;
  *) echo "demo: DB is mariadb (default) or postgres, not ${DB}" >&2; exit 2 ;;
esac
$SERVICES up "$db" namesrv broker
eval "$($SERVICES env)"
if [[ ${1:-} == reconcile ]]; then
  shift
  exec $GO run ./examples/payment reconcile -engine "$engine" "$@"
fi
exec $GO run ./examples/payment -engine "$engine" "$@"
