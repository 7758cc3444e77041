#!/usr/bin/env bash
# The bench against a durable MariaDB (innodb_flush_log_at_trx_commit=1, the
# server default) next to the test bed's (=2), without touching the shared
# services: a private MariaDB is started on its own port and data folder
# (same flags as scripts/services.sh otherwise), the bench runs against it
# and the shared broker, and the private server is stopped afterwards.
#
#   scripts/bench-durable.sh                          full run
#   scripts/bench-durable.sh -workloads producer,consumer -rounds 5
#   BENCH_JSON=/tmp/d.json scripts/bench-durable.sh
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

bash scripts/services.sh up >/dev/null
eval "$(bash scripts/services.sh env)"

PORT=${RMQTX_DURABLE_PORT:-3317}
DIR=${RMQTX_DURABLE_DIR:-$ROOT/.run/bench-durable}
SOCK=$DIR/mariadb.sock
mkdir -p "$DIR"

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  echo "bench-durable: port $PORT is taken; set RMQTX_DURABLE_PORT" >&2
  exit 1
fi
if [[ ! -d $DIR/data/mysql ]]; then
  mariadb-install-db --no-defaults --user=root --datadir="$DIR/data" \
    --auth-root-authentication-method=socket --skip-test-db >"$DIR/install.log" 2>&1
fi
setsid mariadbd --no-defaults --user=root --datadir="$DIR/data" \
  --bind-address=127.0.0.1 --port="$PORT" --socket="$SOCK" \
  --pid-file="$DIR/mariadbd.pid" --log-error="$DIR/error.log" \
  --skip-name-resolve --max-connections=1000 --character-set-server=utf8mb4 \
  --collation-server=utf8mb4_bin --innodb-buffer-pool-size=256M \
  --innodb-flush-log-at-trx-commit=1 --innodb-lock-wait-timeout=20 \
  --skip-log-bin </dev/null >>"$DIR/stdout.log" 2>&1 &
DBPID=$!
stop() { kill "$DBPID" 2>/dev/null || true; wait "$DBPID" 2>/dev/null || true; }
trap stop EXIT

for _ in $(seq 1 100); do
  mariadb --no-defaults -uroot -S "$SOCK" -e 'SELECT 1' >/dev/null 2>&1 && break
  sleep 0.3
done
mariadb --no-defaults -uroot -S "$SOCK" <<SQL
CREATE USER IF NOT EXISTS '$RMQTX_MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$RMQTX_MYSQL_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$RMQTX_MYSQL_USER'@'127.0.0.1';
SQL
echo "bench-durable: MariaDB with innodb_flush_log_at_trx_commit=$(mariadb --no-defaults -uroot -S "$SOCK" -N -e 'SELECT @@innodb_flush_log_at_trx_commit') on 127.0.0.1:$PORT" >&2

broker_version=$(bash scripts/services.sh status 2>/dev/null | sed -n 's#^jar cache .*/rocketmq-\([^/]*\)/lib$#\1#p' || true)
export RMQTX_ROCKETMQ_VERSION=${broker_version:-${RMQTX_ROCKETMQ_VERSION:-unknown}}
export RMQTX_MYSQL_ADDR=127.0.0.1:$PORT
export RMQTX_TX_TIMEOUT_MS=${RMQTX_TX_TIMEOUT_MS:-3000}
export RMQTX_TX_CHECK_INTERVAL_MS=${RMQTX_TX_CHECK_INTERVAL_MS:-2000}
export RMQTX_TX_CHECK_MAX=${RMQTX_TX_CHECK_MAX:-32}
go run ./cmd/rmqtx-bench -json "${BENCH_JSON:-.run/bench-results-durable.json}" "$@"
