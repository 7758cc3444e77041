#!/usr/bin/env bash
# Local test bed for rmqtx: a real MariaDB and a real Apache RocketMQ (namesrv +
# broker), on loopback only, installed and started without Docker.
#
#   scripts/services.sh install                       install MariaDB and fetch the RocketMQ jars only
#   scripts/services.sh up [mariadb|namesrv|broker]   install if missing, start, wait until usable
#   scripts/services.sh down [mariadb|namesrv|broker] stop what this script started (recorded PIDs)
#   scripts/services.sh kill9 broker|namesrv|mariadb  SIGKILL one service (fault tests)
#   scripts/services.sh status                        what runs, on which port
#   scripts/services.sh logs [mariadb|namesrv|broker] tail the logs
#   scripts/services.sh admin <mqadmin args>          RocketMQ admin tool, name server preset
#   scripts/services.sh env                           print the settings as shell exports
#
# Every setting can be changed from the environment; see the defaults below.
# `up` is idempotent: a second call only checks the services and returns.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN_DIR=${RMQTX_RUN_DIR:-$ROOT/.run}
CACHE_DIR=${RMQTX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmqtx}
ROCKETMQ_VERSION=${RMQTX_ROCKETMQ_VERSION:-5.3.3}
MYSQL_PORT=${RMQTX_MYSQL_PORT:-3307}
MYSQL_USER=${RMQTX_MYSQL_USER:-rmqtx}
MYSQL_PASSWORD=${RMQTX_MYSQL_PASSWORD:-rmqtx}
MYSQL_DATABASE=${RMQTX_MYSQL_DATABASE:-rmqtx}
NAMESRV_PORT=${RMQTX_NAMESRV_PORT:-9876}
BROKER_PORT=${RMQTX_BROKER_PORT:-10911}
# Short transaction-check settings for tests (the broker's defaults are 6000 / 30000 / 15).
TX_TIMEOUT_MS=${RMQTX_TX_TIMEOUT_MS:-3000}
TX_CHECK_INTERVAL_MS=${RMQTX_TX_CHECK_INTERVAL_MS:-2000}
TX_CHECK_MAX=${RMQTX_TX_CHECK_MAX:-5}
WAIT_SECONDS=${RMQTX_WAIT_SECONDS:-180}

LIB_DIR=$CACHE_DIR/rocketmq-$ROCKETMQ_VERSION/lib
DB_DIR=$RUN_DIR/mariadb
RMQ_DIR=$RUN_DIR/rocketmq
PID_DIR=$RUN_DIR/pids
MYSQL_SOCK=$DB_DIR/mysqld.sock

JDK_FLAGS=(--add-opens java.base/java.nio=ALL-UNNAMED --add-exports java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.util=ALL-UNNAMED)

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

pid_of() { # service -> pid if alive
  local f=$PID_DIR/$1.pid
  [[ -f $f ]] || return 1
  local pid
  pid=$(cat "$f")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# ---------- installs ----------

ensure_mariadb_installed() {
  command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null && return
  log "installing MariaDB from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  # policy-rc.d keeps the package from starting a system-wide server on 3306.
  apt-get install -y -qq --no-install-recommends mariadb-server mariadb-client >/dev/null
  command -v mariadbd >/dev/null || die "mariadb-server installed but mariadbd not found"
}

ensure_jars() {
  [[ -f $LIB_DIR/.complete ]] && return
  command -v mvn >/dev/null || die "Maven (mvn) is required to fetch the RocketMQ jars"
  log "fetching RocketMQ $ROCKETMQ_VERSION jars from Maven Central into $LIB_DIR (cached)"
  mkdir -p "$LIB_DIR"
  mvn -q -B -f "$ROOT/scripts/rocketmq/pom.xml" -Drocketmq.version="$ROCKETMQ_VERSION" \
    dependency:copy-dependencies -DoutputDirectory="$LIB_DIR" -DincludeScope=runtime >&2 \
    || die "mvn could not fetch the RocketMQ jars"
  ls "$LIB_DIR"/rocketmq-broker-*.jar >/dev/null 2>&1 || die "rocketmq-broker jar missing after mvn"
  touch "$LIB_DIR/.complete"
}

# ---------- MariaDB ----------

mysql_root() { mariadb --no-defaults -uroot -S "$MYSQL_SOCK" "$@"; }

start_mariadb() {
  if pid_of mariadb >/dev/null; then return; fi
  ensure_mariadb_installed
  mkdir -p "$DB_DIR" "$PID_DIR"
  if [[ ! -d $DB_DIR/data/mysql ]]; then
    log "initialising MariaDB data folder $DB_DIR/data"
    mariadb-install-db --no-defaults --user=root --datadir="$DB_DIR/data" \
      --auth-root-authentication-method=socket --skip-test-db >"$DB_DIR/install.log" 2>&1 \
      || { tail -20 "$DB_DIR/install.log" >&2; die "mariadb-install-db failed"; }
  fi
  port_open "$MYSQL_PORT" && die "port $MYSQL_PORT is taken by another process; set RMQTX_MYSQL_PORT"
  log "starting MariaDB on 127.0.0.1:$MYSQL_PORT"
  setsid mariadbd --no-defaults --user=root --datadir="$DB_DIR/data" \
    --bind-address=127.0.0.1 --port="$MYSQL_PORT" --socket="$MYSQL_SOCK" \
    --pid-file="$DB_DIR/mariadbd.pid" --log-error="$DB_DIR/error.log" \
    --skip-name-resolve --max-connections=1000 --character-set-server=utf8mb4 \
    --collation-server=utf8mb4_bin --innodb-buffer-pool-size=256M \
    --innodb-flush-log-at-trx-commit=2 --innodb-lock-wait-timeout=20 \
    --skip-log-bin </dev/null >>"$DB_DIR/stdout.log" 2>&1 &
  echo $! >"$PID_DIR/mariadb.pid"
}

wait_mariadb() {
  local deadline=$((SECONDS + WAIT_SECONDS))
  until mysql_root -e 'SELECT 1' >/dev/null 2>&1; do
    pid_of mariadb >/dev/null || { tail -30 "$DB_DIR/error.log" >&2; die "MariaDB exited during start-up"; }
    ((SECONDS < deadline)) || { tail -30 "$DB_DIR/error.log" >&2; die "MariaDB not ready after ${WAIT_SECONDS}s"; }
    sleep 0.3
  done
  # Values are quoted by the server (QUOTE); the user name is checked first.
  [[ $MYSQL_USER =~ ^[A-Za-z0-9_]+$ && $MYSQL_DATABASE =~ ^[A-Za-z0-9_]+$ ]] || die "bad user or database name"
  mysql_root <<SQL
CREATE DATABASE IF NOT EXISTS \`$MYSQL_DATABASE\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'127.0.0.1' IDENTIFIED BY '$MYSQL_PASSWORD';
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'localhost' IDENTIFIED BY '$MYSQL_PASSWORD';
GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'127.0.0.1';
GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'localhost';
SQL
}

# ---------- RocketMQ ----------

write_rocketmq_conf() {
  mkdir -p "$RMQ_DIR/home" "$RMQ_DIR/store" "$RMQ_DIR/logs" "$PID_DIR"
  cat >"$RMQ_DIR/namesrv.conf" <<EOF
listenPort=$NAMESRV_PORT
bindAddress=127.0.0.1
EOF
  # Generated from scripts/rocketmq/broker.conf (the checked-in reference that
  # docker/ also uses) with this run's ports, folders and check settings.
  sed -e "s#^listenPort=.*#listenPort=$BROKER_PORT#" \
      -e "s#^namesrvAddr=.*#namesrvAddr=127.0.0.1:$NAMESRV_PORT#" \
      -e "s#^storePathRootDir=.*#storePathRootDir=$RMQ_DIR/store#" \
      -e "s#^storePathCommitLog=.*#storePathCommitLog=$RMQ_DIR/store/commitlog#" \
      -e "s#^haListenPort=.*#haListenPort=$((BROKER_PORT + 1))#" \
      -e "s#^transactionTimeOut=.*#transactionTimeOut=$TX_TIMEOUT_MS#" \
      -e "s#^transactionCheckInterval=.*#transactionCheckInterval=$TX_CHECK_INTERVAL_MS#" \
      -e "s#^transactionCheckMax=.*#transactionCheckMax=$TX_CHECK_MAX#" \
      "$ROOT/scripts/rocketmq/broker.conf" >"$RMQ_DIR/broker.conf"
}

java_common() {
  echo -server -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow \
    -Duser.home="$RMQ_DIR" -Drocketmq.home.dir="$RMQ_DIR/home" \
    -Drocketmq.broker.diskSpaceWarningLevelRatio=0.98 -Drocketmq.broker.diskSpaceCleanForciblyRatio=0.97 \
    "${JDK_FLAGS[@]}"
}

start_namesrv() {
  if pid_of namesrv >/dev/null; then return; fi
  ensure_jars
  write_rocketmq_conf
  port_open "$NAMESRV_PORT" && die "port $NAMESRV_PORT is taken by another process; set RMQTX_NAMESRV_PORT"
  log "starting RocketMQ namesrv on 127.0.0.1:$NAMESRV_PORT"
  # shellcheck disable=SC2046
  ROCKETMQ_HOME="$RMQ_DIR/home" setsid java -Xms128m -Xmx256m $(java_common) -cp "$LIB_DIR/*" \
    org.apache.rocketmq.namesrv.NamesrvStartup -c "$RMQ_DIR/namesrv.conf" \
    </dev/null >>"$RMQ_DIR/logs/namesrv.out" 2>&1 &
  echo $! >"$PID_DIR/namesrv.pid"
}

start_broker() {
  if pid_of broker >/dev/null; then return; fi
  ensure_jars
  write_rocketmq_conf
  port_open "$BROKER_PORT" && die "port $BROKER_PORT is taken by another process; set RMQTX_BROKER_PORT"
  log "starting RocketMQ broker on 127.0.0.1:$BROKER_PORT (tx timeout ${TX_TIMEOUT_MS}ms, check every ${TX_CHECK_INTERVAL_MS}ms, max $TX_CHECK_MAX checks)"
  # shellcheck disable=SC2046
  ROCKETMQ_HOME="$RMQ_DIR/home" setsid java -Xms512m -Xmx512m -XX:MaxDirectMemorySize=512m $(java_common) \
    -cp "$LIB_DIR/*" org.apache.rocketmq.broker.BrokerStartup -c "$RMQ_DIR/broker.conf" \
    </dev/null >>"$RMQ_DIR/logs/broker.out" 2>&1 &
  echo $! >"$PID_DIR/broker.pid"
}

mqadmin() {
  ensure_jars
  # shellcheck disable=SC2046
  ROCKETMQ_HOME="$RMQ_DIR/home" java -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 $(java_common) -cp "$LIB_DIR/*" \
    org.apache.rocketmq.tools.command.MQAdminStartup "$@"
}

broker_fail() {
  log "$1; last lines of the broker's output:"
  tail -40 "$RMQ_DIR/logs/broker.out" >&2 || true
  tail -40 "$RMQ_DIR/logs/rocketmqlogs/broker.log" >&2 2>/dev/null || true
  die "$1"
}

wait_rocketmq() {
  local deadline=$((SECONDS + WAIT_SECONDS))
  until port_open "$NAMESRV_PORT"; do
    pid_of namesrv >/dev/null || { tail -30 "$RMQ_DIR/logs/namesrv.out" >&2; die "namesrv exited during start-up"; }
    ((SECONDS < deadline)) || die "namesrv not listening after ${WAIT_SECONDS}s"
    sleep 0.3
  done
  until port_open "$BROKER_PORT"; do
    pid_of broker >/dev/null || broker_fail "broker exited during start-up"
    ((SECONDS < deadline)) || broker_fail "broker not listening after ${WAIT_SECONDS}s"
    sleep 0.3
  done
  # Usable means: registered with the name server under 127.0.0.1, and a send
  # through the route is stored. internal/tools/svcready checks both in one
  # process; a JVM (mqadmin) per attempt was slower than the broker itself on
  # a loaded machine. The remaining time of the same deadline is its budget.
  local left=$((deadline - SECONDS)) out
  ((left > 5)) || left=5
  if ! out=$(svcready -namesrv "127.0.0.1:$NAMESRV_PORT" -broker "127.0.0.1:$BROKER_PORT" -timeout "${left}s" 2>&1); then
    pid_of broker >/dev/null || broker_fail "broker exited before accepting a send"
    echo "$out" >&2
    broker_fail "broker not usable within ${WAIT_SECONDS}s of start"
  fi
}

# svcready builds (once; go build is a no-op when it is up to date) and runs
# the readiness probe.
svcready() {
  local bin=$RUN_DIR/bin/svcready
  mkdir -p "$RUN_DIR/bin"
  (cd "$ROOT" && go build -o "$bin" ./internal/tools/svcready) || die "cannot build internal/tools/svcready (Go is required)"
  "$bin" "$@"
}

# ---------- commands ----------

want() { [[ -z ${1:-} || $1 == "$2" ]]; }

cmd_up() {
  local only=${1:-}
  local t0=$SECONDS
  mkdir -p "$PID_DIR"
  if [[ -z $only ]] && pid_of mariadb >/dev/null && pid_of namesrv >/dev/null && pid_of broker >/dev/null; then
    log "already up (use 'status' for details)"
    return
  fi
  want "$only" mariadb && start_mariadb
  want "$only" namesrv && start_namesrv
  want "$only" broker && start_broker
  want "$only" mariadb && wait_mariadb
  if want "$only" namesrv || want "$only" broker; then wait_rocketmq; fi
  log "up in $((SECONDS - t0))s: MariaDB 127.0.0.1:$MYSQL_PORT, namesrv 127.0.0.1:$NAMESRV_PORT, broker 127.0.0.1:$BROKER_PORT"
}

stop_one() { # service signal
  local pid
  pid=$(pid_of "$1") || { rm -f "$PID_DIR/$1.pid"; return 0; }
  log "stopping $1 (pid $pid)"
  kill "-$2" "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then log "$1 did not stop in 20s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$PID_DIR/$1.pid"
}

cmd_down() {
  local only=${1:-}
  want "$only" broker && stop_one broker TERM
  want "$only" namesrv && stop_one namesrv TERM
  want "$only" mariadb && stop_one mariadb TERM
  return 0
}

cmd_kill9() {
  [[ -n ${1:-} ]] || die "usage: kill9 broker|namesrv|mariadb"
  stop_one "$1" KILL
}

cmd_status() {
  local s pid port rc=0
  for s in mariadb namesrv broker; do
    case $s in mariadb) port=$MYSQL_PORT ;; namesrv) port=$NAMESRV_PORT ;; broker) port=$BROKER_PORT ;; esac
    if pid=$(pid_of $s); then
      printf '%-8s running  pid %-7s 127.0.0.1:%s\n' "$s" "$pid" "$port"
    else
      printf '%-8s stopped\n' "$s"; rc=3
    fi
  done
  printf 'run dir  %s\njar cache %s\n' "$RUN_DIR" "$LIB_DIR"
  return $rc
}

cmd_logs() {
  local only=${1:-}
  want "$only" mariadb && { echo "== mariadb ($DB_DIR/error.log)"; tail -n "${LINES_:-40}" "$DB_DIR/error.log" 2>/dev/null || true; }
  want "$only" namesrv && { echo "== namesrv"; tail -n 40 "$RMQ_DIR/logs/namesrv.out" 2>/dev/null || true; }
  want "$only" broker && { echo "== broker"; tail -n 40 "$RMQ_DIR/logs/broker.out" 2>/dev/null || true
    echo "== broker.log"; tail -n 40 "$RMQ_DIR/logs/rocketmqlogs/broker.log" 2>/dev/null || true; }
  return 0
}

cmd_env() {
  cat <<EOF
export RMQTX_MYSQL_ADDR=127.0.0.1:$MYSQL_PORT
export RMQTX_MYSQL_USER=$MYSQL_USER
export RMQTX_MYSQL_PASSWORD=$MYSQL_PASSWORD
export RMQTX_MYSQL_DATABASE=$MYSQL_DATABASE
export RMQTX_NAMESRV=127.0.0.1:$NAMESRV_PORT
export RMQTX_BROKER=127.0.0.1:$BROKER_PORT
EOF
}

case ${1:-} in
  install) ensure_mariadb_installed; ensure_jars ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  kill9) shift; cmd_kill9 "$@" ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  admin) shift; mqadmin "$@" ;;
  env) cmd_env ;;
  *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
