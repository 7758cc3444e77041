#!/usr/bin/env bash
# The README's main command (`make demo`): start the local services, then run
# the payment-success example end to end and print its summary.
#
#   bash scripts/demo.sh [flags for examples/payment]   e.g. -payments 500
#   bash scripts/demo.sh reconcile [-db NAME]           reconcile a demo database again
#
# The exit status is the example's: 0 when reconciliation finds no discrepancy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/services.sh up
eval "$(bash scripts/services.sh env)"
exec go run ./examples/payment "$@"
