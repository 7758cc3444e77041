#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs and starts MariaDB and
# RocketMQ if needed (scripts/services.sh up), then runs every test with the
# race detector and the crash-test failpoints compiled in, then every fuzz
# target briefly. Leaves the services running; `make down` stops them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/services.sh up
eval "$(bash scripts/services.sh env)"

echo "== go test -race -tags failpoints ./..."
go test -race -tags failpoints -count=1 -timeout 45m ${RMQTX_TEST_ARGS:-} ./...

if [[ -x scripts/fuzz.sh ]]; then
  echo "== fuzz targets (${FUZZTIME:-10s} each)"
  bash scripts/fuzz.sh
fi
