#!/usr/bin/env bash
# Local test bed for rmqtx: a real MariaDB, a real PostgreSQL and a real Apache
# RocketMQ (namesrv + broker), on loopback only, installed and started without Docker.
#
#   scripts/services.sh install                       install MariaDB and PostgreSQL, fetch the RocketMQ jars
#   scripts/services.sh up [SERVICE...]               install if missing, start, wait until usable (default: all)
#   scripts/services.sh down [SERVICE...]             stop what this script started (recorded PIDs)
#   scripts/services.sh kill9 broker|broker-b|namesrv|mariadb|postgres  SIGKILL one service (fault tests)
#   RMQTX_BROKERS=ha scripts/services.sh kill9 master|slave|n0|n1         (HA bed) SIGKILL a replica
#   scripts/services.sh status                        what runs, on which port
#   scripts/services.sh logs [SERVICE...]             tail the logs
#   scripts/services.sh admin <mqadmin args>          RocketMQ admin tool, name server preset
#   scripts/services.sh env                           print the settings as shell exports
#
# SERVICE is mariadb, postgres, namesrv, broker or broker-b. Every setting can
# be changed from the environment; see the defaults below.
# RMQTX_BROKERS=2 starts a two-master cluster: broker-a ("broker", on
# RMQTX_BROKER_PORT) and broker-b (on RMQTX_BROKER_B_PORT), each with its own
# ports and store, registered with the one name server (cluster tests).
# RMQTX_BROKERS=ha starts the HA bed instead: a name server with RocketMQ's
# controller embedded (scripts/rocketmq/namesrv-ha.conf) and one master-slave
# pair in controller mode, n0 and n1, both named broker-a
# (scripts/rocketmq/broker-ha.conf: synchronous replication,
# allAckInSyncStateSet=true). The controller elects the master; `up` waits
# until its sync state set holds both nodes, `status` shows who is master,
# `kill9 master` / `kill9 slave` kill whichever node has that role now, and
# `up` restarts a killed node, which rejoins as slave. Its own ports
# (namesrv 9976, controller namesrv+2, n0 10951, n1 n0+100), store folder
# (rocketmq-ha) and pid files, so it runs beside the single-broker bed and
# shares its databases; `down` without names leaves the databases running.
# RMQTX_AUTO_CREATE_TOPIC=false starts brokers that refuse sends to a topic
# nobody created (autoCreateTopicEnable=false), as most production clusters
# do; the default, true, creates a topic on its first send.
# `up` is idempotent: a second call only checks the services and returns.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUN_DIR=${RMQTX_RUN_DIR:-$ROOT/.run}
[[ $RUN_DIR == /* ]] || RUN_DIR=$PWD/$RUN_DIR # psql takes an absolute socket folder
CACHE_DIR=${RMQTX_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmqtx}
ROCKETMQ_VERSION=${RMQTX_ROCKETMQ_VERSION:-5.3.3}
MYSQL_PORT=${RMQTX_MYSQL_PORT:-3307}
MYSQL_USER=${RMQTX_MYSQL_USER:-rmqtx}
MYSQL_PASSWORD=${RMQTX_MYSQL_PASSWORD:-rmqtx}
MYSQL_DATABASE=${RMQTX_MYSQL_DATABASE:-rmqtx}
PG_PORT=${RMQTX_PG_PORT:-5433}
PG_USER=${RMQTX_PG_USER:-rmqtx}
PG_PASSWORD=${RMQTX_PG_PASSWORD:-rmqtx}
PG_DATABASE=${RMQTX_PG_DATABASE:-rmqtx}
NAMESRV_PORT=${RMQTX_NAMESRV_PORT:-9876}
BROKER_PORT=${RMQTX_BROKER_PORT:-10911}
BROKERS=${RMQTX_BROKERS:-1}
BROKER_B_PORT=${RMQTX_BROKER_B_PORT:-$((BROKER_PORT + 100))}
[[ $BROKERS == 1 || $BROKERS == 2 || $BROKERS == ha ]] || { echo "[services] ERROR: RMQTX_BROKERS must be 1, 2 or ha" >&2; exit 1; }
# The HA bed's own defaults (see above): other ports than the shared bed's.
if [[ $BROKERS == ha ]]; then
  [[ -n ${RMQTX_NAMESRV_PORT:-} ]] || NAMESRV_PORT=9976
  [[ -n ${RMQTX_BROKER_PORT:-} ]] || BROKER_PORT=10951
  [[ -n ${RMQTX_BROKER_B_PORT:-} ]] || BROKER_B_PORT=$((BROKER_PORT + 100))
fi
# The controller's own port (HA bed only): its DLedger address, which the
# brokers set as controllerAddr.
CONTROLLER_PORT=${RMQTX_CONTROLLER_PORT:-$((NAMESRV_PORT + 2))}
AUTO_CREATE_TOPIC=${RMQTX_AUTO_CREATE_TOPIC:-true}
[[ $AUTO_CREATE_TOPIC == true || $AUTO_CREATE_TOPIC == false ]] || { echo "[services] ERROR: RMQTX_AUTO_CREATE_TOPIC must be true or false" >&2; exit 1; }
# Heaps: one broker gets 512 MiB; each broker of the two-broker cluster 384 MiB;
# each replica of the HA bed 256 MiB.
BROKER_HEAP=${RMQTX_BROKER_HEAP:-$([[ $BROKERS == 2 ]] && echo 384m || echo 512m)}
if [[ $BROKERS == ha && -z ${RMQTX_BROKER_HEAP:-} ]]; then BROKER_HEAP=256m; fi
# Short transaction-check settings for tests (the broker's defaults are 6000 / 30000 / 15).
# broker.conf's transactionOpBatchInterval (1000) stays below TX_TIMEOUT_MS, so the
# broker never re-checks an answered half; keep it that way (see start_broker).
# 32 checks keep a half for about 67 s before the broker discards it, so that
# txproducer's default FenceAge (60 s) fits: FenceAge + interval < timeout +
# (max-1) x interval, i.e. FenceAge < 63 s; a default Start warns of nothing.
# The fault and cluster suites' private brokers set 5 (13 s) for fast discards.
TX_TIMEOUT_MS=${RMQTX_TX_TIMEOUT_MS:-3000}
TX_CHECK_INTERVAL_MS=${RMQTX_TX_CHECK_INTERVAL_MS:-2000}
TX_CHECK_MAX=${RMQTX_TX_CHECK_MAX:-32}
# How long a send may wait in the broker's queue before the broker fails it
# fast ([TIMEOUT_CLEAN_QUEUE] broker busy); empty keeps broker.conf's value.
# A test that freezes the broker (SIGSTOP) sets it above the freeze, or the
# thawed broker may answer the send it held with "broker busy".
SEND_QUEUE_WAIT_MS=${RMQTX_SEND_QUEUE_WAIT_MS:-}
WAIT_SECONDS=${RMQTX_WAIT_SECONDS:-180}

LIB_DIR=$CACHE_DIR/rocketmq-$ROCKETMQ_VERSION/lib
DB_DIR=$RUN_DIR/mariadb
RMQ_DIR=$RUN_DIR/rocketmq
# The HA bed keeps its name server, controller and replicas apart from the
# shared bed's, in the same run folder.
if [[ $BROKERS == ha ]]; then RMQ_DIR=$RUN_DIR/rocketmq-ha; fi
PID_DIR=$RUN_DIR/pids
MYSQL_SOCK=$DB_DIR/mysqld.sock
# PostgreSQL's folder (data, socket, log): $RUN_DIR/postgres, unless the
# cluster had to move out of the run folder (see pg_place), which records
# where in $PG_RECORD.
PG_RECORD=$RUN_DIR/postgres.dir
PG_DIR=$RUN_DIR/postgres
if [[ -s $PG_RECORD ]]; then PG_DIR=$(<"$PG_RECORD"); fi

JDK_FLAGS=(--add-opens java.base/java.nio=ALL-UNNAMED --add-exports java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.util=ALL-UNNAMED)

log() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

# pid_file: where a service's PID is recorded. The HA bed's RocketMQ
# services have files of their own (ha-namesrv.pid, ha-n0.pid, ...), so that
# they never stand for the shared bed's name server and broker.
pid_file() {
  if [[ $BROKERS == ha && $1 != mariadb && $1 != postgres ]]; then echo "$PID_DIR/ha-$1.pid"; else echo "$PID_DIR/$1.pid"; fi
}

pid_of() { # service -> pid if alive
  local f
  f=$(pid_file "$1")
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

# ---------- PostgreSQL ----------
# A private cluster under $PG_DIR (data, socket, log), listening on
# 127.0.0.1:$PG_PORT only. initdb and postgres refuse to run as root, so as
# root they run as the "postgres" system user (the Debian package creates it)
# and $PG_DIR belongs to that user. That user must reach $PG_DIR: when it
# cannot enter the run folder (a clone under /root, or inside a 0700
# `mktemp -d` folder), the cluster lives under its own home instead (pg_place);
# nothing of the user's folders is opened up. fsync=off is the analogue of MariaDB's
# innodb-flush-log-at-trx-commit=2: a commit is written to the OS before it
# returns, so a killed server loses nothing, only a machine crash would.
# synchronous_commit stays on for exactly that reason.

pg_bin_dir() { # the newest installed server's bin folder
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -n -r); do
    [[ -x $d/initdb && -x $d/postgres ]] && { echo "$d"; return; }
  done
  return 1
}

ensure_postgres_installed() {
  pg_bin_dir >/dev/null && return
  log "installing PostgreSQL from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  # No system-wide "main" cluster on 5432: this script runs its own.
  mkdir -p /etc/postgresql-common/createcluster.d
  echo "create_main_cluster = false" >/etc/postgresql-common/createcluster.d/rmqtx.conf
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends postgresql postgresql-client >/dev/null
  pg_bin_dir >/dev/null || die "postgresql installed but initdb/postgres not found under /usr/lib/postgresql"
}

# as_pg runs a command as the cluster's owner: root cannot run initdb or
# postgres. setpriv execs in place (start_postgres uses it directly, so the
# recorded PID is the server's own).
as_pg() {
  if ((EUID == 0)); then
    setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
  else
    "$@"
  fi
}

pg_psql() { psql -X -q -v ON_ERROR_STOP=1 -h "$PG_DIR/sock" -p "$PG_PORT" -U postgres "$@"; }

# pg_place picks the cluster's folder on its first start as root: the run
# folder's own postgres/ when the postgres user can enter the run folder,
# otherwise <base>/rmqtx-postgres/<hash of the run folder's path>, where base
# is the first of that user's home and /var/tmp that it can enter. The choice
# is recorded in $PG_RECORD, so that every later command (up, down, status,
# logs, env) finds the same cluster; a run folder that is new (no record)
# starts from an empty cluster, as it would in place.
pg_place() {
  [[ -s $PG_RECORD ]] && return
  ((EUID == 0)) || return 0
  mkdir -p "$RUN_DIR"
  as_pg test -x "$RUN_DIR" -a -r "$RUN_DIR" 2>/dev/null && return
  local run base home
  run=$(realpath -ms "$RUN_DIR")
  home=$(getent passwd postgres | cut -d: -f6)
  for base in "$home" /var/tmp ""; do
    [[ -n $base ]] && as_pg test -x "$base" 2>/dev/null && break
  done
  [[ -n $base ]] || die "the postgres user can enter neither the run folder $RUN_DIR nor its home ($home) nor /var/tmp; set RMQTX_RUN_DIR to a folder it can enter"
  base=$base/rmqtx-postgres
  PG_DIR=$base/$(printf '%s' "$run" | sha256sum | cut -c1-16)
  log "the postgres user cannot enter $RUN_DIR: PostgreSQL's folder is $PG_DIR"
  install -d -m 0755 "$base"
  # Recorded first: from here on pg_collect of another run leaves it alone.
  echo "$PG_DIR" >"$PG_RECORD"
  pg_collect "$base"
  if [[ -e $PG_DIR ]]; then
    # Left by an earlier run folder at the same path, since removed.
    pg_running "$PG_DIR" && die "a PostgreSQL of an earlier run folder at $run still runs from $PG_DIR; stop it first"
    rm -rf "$PG_DIR"
  fi
  install -d -m 0700 "$PG_DIR"
  echo "$run" >"$PG_DIR/run-dir"
}

# pg_running: a postmaster runs from the cluster folder $1.
pg_running() {
  local pid
  [[ -f $1/data/postmaster.pid ]] || return 1
  pid=$(head -n 1 "$1/data/postmaster.pid")
  [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null
}

# pg_collect removes the moved clusters under $1 whose run folder is gone
# (a test's private run folder, removed with rm -rf) and that no server runs
# from; a run folder that still records one keeps it.
pg_collect() {
  local d owner
  for d in "$1"/*; do
    [[ -f $d/run-dir ]] || continue
    owner=$(<"$d/run-dir")
    [[ -s $owner/postgres.dir && $(<"$owner/postgres.dir") == "$d" ]] && continue
    pg_running "$d" && continue
    log "removing $d: PostgreSQL folder of the run folder $owner, which is gone"
    rm -rf "$d"
  done
}

start_postgres() {
  if pid_of postgres >/dev/null; then return; fi
  ensure_postgres_installed
  local bin
  bin=$(pg_bin_dir)
  if ((EUID == 0)); then
    id postgres >/dev/null 2>&1 || die "running as root needs the 'postgres' system user (apt's postgresql package creates it)"
    pg_place
  fi
  mkdir -p "$PG_DIR/sock" "$PID_DIR"
  if ((EUID == 0)); then chown -R postgres: "$PG_DIR"; fi
  if [[ ! -f $PG_DIR/data/PG_VERSION ]]; then
    log "initialising PostgreSQL data folder $PG_DIR/data"
    # Local superuser "postgres" by socket (trust; the socket lives in the
    # private folder); TCP needs a password. Byte-order collation, as
    # MariaDB's utf8mb4_bin.
    # From inside the folder: as the postgres user, the caller's working
    # folder may be out of reach (initdb: "could not identify current directory").
    (cd "$PG_DIR" && as_pg "$bin/initdb" -D "$PG_DIR/data" -U postgres --encoding=UTF8 --locale=C \
      --auth-local=trust --auth-host=scram-sha-256) >"$PG_DIR/initdb.log" 2>&1 \
      || { tail -20 "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
  fi
  port_open "$PG_PORT" && die "port $PG_PORT is taken by another process; set RMQTX_PG_PORT"
  log "starting PostgreSQL $(basename "$(dirname "$bin")") on 127.0.0.1:$PG_PORT"
  # Its log file is opened by this shell, before the user switch.
  local run=()
  ((EUID == 0)) && run=(setpriv --reuid=postgres --regid=postgres --init-groups --)
  # The subshell execs setsid, which execs the server: $! is its PID.
  (cd "$PG_DIR" && exec setsid "${run[@]}" "$bin/postgres" -D "$PG_DIR/data" -c listen_addresses=127.0.0.1 -p "$PG_PORT" \
    -c unix_socket_directories="$PG_DIR/sock" -c max_connections=400 -c shared_buffers=128MB \
    -c fsync=off -c full_page_writes=off -c synchronous_commit=on -c timezone=UTC \
    -c max_prepared_transactions=0 -c log_min_messages=warning -c log_line_prefix='%m [%p] ') \
    </dev/null >>"$PG_DIR/postgres.log" 2>&1 &
  echo $! >"$PID_DIR/postgres.pid"
}

wait_postgres() {
  local deadline=$((SECONDS + WAIT_SECONDS))
  until pg_psql -d postgres -c 'SELECT 1' >/dev/null 2>&1; do
    pid_of postgres >/dev/null || { tail -30 "$PG_DIR/postgres.log" >&2; die "PostgreSQL exited during start-up"; }
    ((SECONDS < deadline)) || { tail -30 "$PG_DIR/postgres.log" >&2; die "PostgreSQL not ready after ${WAIT_SECONDS}s"; }
    sleep 0.3
  done
  [[ $PG_USER =~ ^[A-Za-z0-9_]+$ && $PG_DATABASE =~ ^[A-Za-z0-9_]+$ ]] || die "bad PostgreSQL user or database name"
  # Idempotent: the role (CREATEDB: every test makes its own database) and
  # its database. psql quotes the password (:'pw').
  pg_psql -d postgres -v pw="$PG_PASSWORD" <<SQL
SELECT format('CREATE ROLE %I LOGIN CREATEDB', '$PG_USER') WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER') \\gexec
ALTER ROLE $PG_USER WITH LOGIN CREATEDB PASSWORD :'pw';
SELECT format('CREATE DATABASE %I OWNER %I', '$PG_DATABASE', '$PG_USER') WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$PG_DATABASE') \\gexec
SQL
}

# ---------- RocketMQ ----------

write_rocketmq_conf() {
  mkdir -p "$RMQ_DIR/home" "$RMQ_DIR/store" "$RMQ_DIR/logs" "$PID_DIR"
  if [[ $BROKERS == ha ]]; then
    # The name server with the controller embedded (namesrv-ha.conf), on
    # this run's ports and folder.
    sed -e "s#^listenPort=.*#listenPort=$NAMESRV_PORT#" \
        -e "s#^controllerDLegerPeers=.*#controllerDLegerPeers=n0-127.0.0.1:$CONTROLLER_PORT#" \
        -e "s#^controllerStorePath=.*#controllerStorePath=$RMQ_DIR/controller#" \
        "$ROOT/scripts/rocketmq/namesrv-ha.conf" >"$RMQ_DIR/namesrv.conf"
  else
    cat >"$RMQ_DIR/namesrv.conf" <<EOF
listenPort=$NAMESRV_PORT
bindAddress=127.0.0.1
EOF
  fi
  # Generated from scripts/rocketmq/broker.conf (the checked-in reference that
  # docker/ also uses) with this run's ports, folders and check settings.
  local svc
  for svc in $(brokers); do
    local port name store
    port=$(broker_port "$svc") name=$(broker_name "$svc") store=$(broker_dir "$svc")/store
    mkdir -p "$store"
    # A store written before the record CRC was on has records without it,
    # which forceVerifyPropCRC would truncate away: such a store keeps the
    # body-only check. A new store is marked and verified in full.
    local verify=true
    if [[ ! -e $store/.rmqtx-propcrc ]]; then
      if [[ -n $(ls -A "$store/commitlog" 2>/dev/null) ]]; then
        verify=false
        log "note: $(broker_name "$svc")'s store predates the record CRC; recovery checks message bodies only (remove $store for full checks)"
      else
        touch "$store/.rmqtx-propcrc"
      fi
    fi
    sed -e "s#^brokerName=.*#brokerName=$name#" \
        -e "s#^listenPort=.*#listenPort=$port#" \
        -e "s#^namesrvAddr=.*#namesrvAddr=127.0.0.1:$NAMESRV_PORT#" \
        -e "s#^storePathRootDir=.*#storePathRootDir=$store#" \
        -e "s#^storePathCommitLog=.*#storePathCommitLog=$store/commitlog#" \
        -e "s#^haListenPort=.*#haListenPort=$((port + 1))#" \
        -e "s#^transactionTimeOut=.*#transactionTimeOut=$TX_TIMEOUT_MS#" \
        -e "s#^transactionCheckInterval=.*#transactionCheckInterval=$TX_CHECK_INTERVAL_MS#" \
        -e "s#^transactionCheckMax=.*#transactionCheckMax=$TX_CHECK_MAX#" \
        -e "s#^forceVerifyPropCRC=.*#forceVerifyPropCRC=$verify#" \
        -e "s#^autoCreateTopicEnable=.*#autoCreateTopicEnable=$AUTO_CREATE_TOPIC#" \
        ${SEND_QUEUE_WAIT_MS:+-e "s#^waitTimeMillsInSendQueue=.*#waitTimeMillsInSendQueue=$SEND_QUEUE_WAIT_MS#"} \
        "$ROOT/scripts/rocketmq/broker.conf" >"$RMQ_DIR/$svc.conf"
    # The HA bed's replicas: broker-ha.conf's controller-mode settings after
    # broker.conf's (the last value of a key wins).
    if [[ $BROKERS == ha ]]; then
      sed -e "s#^controllerAddr=.*#controllerAddr=127.0.0.1:$CONTROLLER_PORT#" \
        "$ROOT/scripts/rocketmq/broker-ha.conf" >>"$RMQ_DIR/$svc.conf"
    fi
  done
}

# The brokers this run starts: "broker" (broker-a), and "broker-b" in the
# two-broker cluster; the HA bed's replicas n0 and n1, both broker-a.
brokers() {
  case $BROKERS in 2) echo broker broker-b ;; ha) echo n0 n1 ;; *) echo broker ;; esac
}
broker_port() { if [[ $1 == broker-b || $1 == n1 ]]; then echo "$BROKER_B_PORT"; else echo "$BROKER_PORT"; fi; }
broker_name() { if [[ $1 == broker-b ]]; then echo broker-b; else echo broker-a; fi; }
# broker-a keeps the single-broker layout (store, logs); broker-b and each
# HA replica have their own folder, used as user.home too, so that no two
# share a log file.
broker_dir() { if [[ $1 == broker-b || $1 == n0 || $1 == n1 ]]; then echo "$RMQ_DIR/$1"; else echo "$RMQ_DIR"; fi; }

java_common() { # [user.home]
  echo -server -XX:+UseG1GC -XX:-OmitStackTraceInFastThrow \
    -Duser.home="${1:-$RMQ_DIR}" -Drocketmq.home.dir="$RMQ_DIR/home" \
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
  echo $! >"$(pid_file namesrv)"
}

start_broker() { # broker|broker-b
  local svc=${1:-broker}
  if pid_of "$svc" >/dev/null; then return; fi
  ensure_jars
  write_rocketmq_conf
  local port dir
  port=$(broker_port "$svc") dir=$(broker_dir "$svc")
  mkdir -p "$dir/logs"
  port_open "$port" && die "port $port is taken by another process; set RMQTX_BROKER_PORT / RMQTX_BROKER_B_PORT"
  local op_batch
  op_batch=$(sed -n 's/^transactionOpBatchInterval=//p' "$RMQ_DIR/$svc.conf")
  local label
  label=$(broker_name "$svc")
  if [[ $BROKERS == ha ]]; then label="$label replica $svc (controller mode)"; fi
  log "starting RocketMQ $label on 127.0.0.1:$port (tx timeout ${TX_TIMEOUT_MS}ms, check every ${TX_CHECK_INTERVAL_MS}ms, max $TX_CHECK_MAX checks, op batch ${op_batch:-3000}ms, auto-create topics $AUTO_CREATE_TOPIC)"
  if ((TX_TIMEOUT_MS <= ${op_batch:-3000})); then
    log "note: RMQTX_TX_TIMEOUT_MS ${TX_TIMEOUT_MS} <= transactionOpBatchInterval ${op_batch:-3000}: the broker re-checks answered halves and stores committed events several times"
  fi
  # shellcheck disable=SC2046
  ROCKETMQ_HOME="$RMQ_DIR/home" setsid java -Xms$BROKER_HEAP -Xmx$BROKER_HEAP -XX:MaxDirectMemorySize=512m $(java_common "$dir") \
    -cp "$LIB_DIR/*" org.apache.rocketmq.broker.BrokerStartup -c "$RMQ_DIR/$svc.conf" \
    </dev/null >>"$dir/logs/broker.out" 2>&1 &
  echo $! >"$(pid_file "$svc")"
}

mqadmin() {
  ensure_jars
  # shellcheck disable=SC2046
  ROCKETMQ_HOME="$RMQ_DIR/home" java -Xms64m -Xmx256m -XX:TieredStopAtLevel=1 $(java_common) -cp "$LIB_DIR/*" \
    org.apache.rocketmq.tools.command.MQAdminStartup "$@"
}

broker_fail() { # message [service]
  local dir
  dir=$(broker_dir "${2:-broker}")
  log "$1; last lines of the broker's output:"
  tail -40 "$dir/logs/broker.out" >&2 || true
  tail -40 "$dir/logs/rocketmqlogs/broker.log" >&2 2>/dev/null || true
  die "$1"
}

wait_rocketmq() { # [broker services to wait for; default all]
  local deadline=$((SECONDS + WAIT_SECONDS)) svc port
  until port_open "$NAMESRV_PORT"; do
    pid_of namesrv >/dev/null || { tail -30 "$RMQ_DIR/logs/namesrv.out" >&2; die "namesrv exited during start-up"; }
    ((SECONDS < deadline)) || die "namesrv not listening after ${WAIT_SECONDS}s"
    sleep 0.3
  done
  local args=()
  for svc in $(brokers); do
    want "$svc" "$@" || continue
    port=$(broker_port "$svc")
    until port_open "$port"; do
      pid_of "$svc" >/dev/null || broker_fail "$svc exited during start-up" "$svc"
      ((SECONDS < deadline)) || broker_fail "$svc not listening after ${WAIT_SECONDS}s" "$svc"
      sleep 0.3
    done
    args+=(-broker "$(broker_name "$svc")=127.0.0.1:$port")
  done
  # Usable means: registered with the name server under 127.0.0.1, and a send
  # to a queue of that broker is stored. internal/tools/svcready checks both
  # in one process; a JVM (mqadmin) per attempt was slower than the broker
  # itself on a loaded machine. The rest of the same deadline is its budget.
  # A broker that does not auto-create topics gets its probe topic created
  # by svcready first (-create-probe-topic).
  local left=$((deadline - SECONDS)) out
  ((left > 5)) || left=5
  if [[ $BROKERS == ha ]]; then
    # The HA bed is usable once the controller has elected a master and its
    # sync state set holds every running replica, each running in the role
    # the controller gave it (internal/tools/hastate); then the master must
    # be routed and store a send, like any broker.
    local running=0 master
    for svc in $(brokers); do if pid_of "$svc" >/dev/null; then running=$((running + 1)); fi; done
    if ! out=$(ha_state -wait-in-sync "$running" -timeout "${left}s" 2>&1); then
      echo "$out" >&2
      broker_fail "the controller reports no master with $running replica(s) in sync within ${WAIT_SECONDS}s" "$(ha_first_running)"
    fi
    master=$(ha_state -master-only -timeout 5s) || die "the controller names no master"
    log "replica set broker-a: $master is master, $running replica(s) in the sync state set"
    args=(-broker "broker-a=127.0.0.1:$(broker_port "$master")")
    left=$((deadline - SECONDS))
    ((left > 5)) || left=5
  fi
  [[ $AUTO_CREATE_TOPIC == true ]] || args+=(-create-probe-topic)
  if ! out=$(svcready -namesrv "127.0.0.1:$NAMESRV_PORT" "${args[@]}" -timeout "${left}s" 2>&1); then
    echo "$out" >&2
    broker_fail "broker not usable within ${WAIT_SECONDS}s of start" "${1:-broker}"
  fi
}

# svcready builds (once; go build is a no-op when it is up to date) and runs
# the readiness probe.
svcready() { go_tool svcready "$@"; }

# go_tool NAME ARGS: build internal/tools/NAME into the run folder (a no-op
# when up to date) and run it.
go_tool() {
  local name=$1 bin=$RUN_DIR/bin/$1
  shift
  mkdir -p "$RUN_DIR/bin"
  (cd "$ROOT" && go build -o "$bin" "./internal/tools/$name") || die "cannot build internal/tools/$name (Go is required)"
  "$bin" "$@"
}

# ha_state ARGS: the controller's view of the HA bed's replica set
# (internal/tools/hastate): who is master, who is in the sync state set, and
# each replica's own role.
ha_state() {
  go_tool hastate -controller "127.0.0.1:$CONTROLLER_PORT" -broker-name broker-a \
    -node "n0=127.0.0.1:$BROKER_PORT" -node "n1=127.0.0.1:$BROKER_B_PORT" "$@"
}

# ha_first_running: a replica whose logs explain a failed start.
ha_first_running() {
  local svc
  for svc in $(brokers); do if pid_of "$svc" >/dev/null; then echo "$svc"; return; fi; done
  echo n0
}

# ha_role ROLE: the replica that has ROLE (master or slave) now, by the
# controller's word; the slave is the running replica that is not master.
ha_role() {
  local master svc
  master=$(ha_state -master-only -timeout 10s) || die "the controller names no master; see 'status'"
  if [[ $1 == master ]]; then echo "$master"; return; fi
  for svc in $(brokers); do
    if [[ $svc != "$master" ]] && pid_of "$svc" >/dev/null; then echo "$svc"; return; fi
  done
  die "no slave runs (master: $master)"
}

# ---------- commands ----------

# The services of this run, in start order.
services() { echo mariadb postgres namesrv $(brokers); }

# want SERVICE [NAMES...]: the command names SERVICE, or names none (all).
want() {
  local svc=$1 n
  shift
  (($# == 0)) && return 0
  for n in "$@"; do [[ $n == "$svc" ]] && return 0; done
  return 1
}

# check_names refuses a name that is not a service of this run (a typo
# would otherwise start or stop nothing and succeed).
check_names() {
  local n
  for n in "$@"; do
    [[ " $(services) " == *" $n "* ]] || die "unknown service '$n' (services: $(services); broker-b needs RMQTX_BROKERS=2, n0 and n1 RMQTX_BROKERS=ha)"
  done
}

# up [NAMES...]: start the named services (all when none) and wait until
# each is usable. `make demo` starts only its database and RocketMQ.
cmd_up() {
  check_names "$@"
  local t0=$SECONDS svc all=1 rmq=() where=()
  mkdir -p "$PID_DIR"
  for svc in $(services); do pid_of "$svc" >/dev/null || all=0; done
  if (($# == 0)) && [[ $all == 1 ]]; then
    log "already up (use 'status' for details)"
    return
  fi
  want mariadb "$@" && start_mariadb
  want postgres "$@" && start_postgres
  want namesrv "$@" && start_namesrv
  for svc in $(brokers); do if want "$svc" "$@"; then start_broker "$svc"; fi; done
  if want mariadb "$@"; then wait_mariadb; where+=("MariaDB 127.0.0.1:$MYSQL_PORT"); fi
  if want postgres "$@"; then wait_postgres; where+=("PostgreSQL 127.0.0.1:$PG_PORT"); fi
  # The name server is usable once every broker registered again: naming it
  # waits for all brokers, as naming none does.
  if want namesrv "$@"; then
    rmq=($(brokers))
  else
    for svc in $(brokers); do if want "$svc" "$@" && (($# > 0)); then rmq+=("$svc"); fi; done
  fi
  if want namesrv "$@" || ((${#rmq[@]} > 0)); then
    wait_rocketmq "${rmq[@]}"
    where+=("namesrv 127.0.0.1:$NAMESRV_PORT")
    for svc in "${rmq[@]}"; do where+=("$(broker_name "$svc") 127.0.0.1:$(broker_port "$svc")"); done
  fi
  local list
  list=$(printf '%s, ' "${where[@]}")
  log "up in $((SECONDS - t0))s: ${list%, }"
}

stop_one() { # service signal
  local pid
  pid=$(pid_of "$1") || { rm -f "$(pid_file "$1")"; return 0; }
  log "stopping $1 (pid $pid)"
  kill "-$2" "$pid" 2>/dev/null || true
  local i
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  if kill -0 "$pid" 2>/dev/null; then log "$1 did not stop in 20s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$(pid_file "$1")"
}

cmd_down() {
  check_names "$@"
  if [[ $BROKERS == ha ]]; then
    # The slave first, so that stopping the master promotes nobody. The
    # databases are the shared bed's too: stopped only when named.
    local first=n1 second=n0
    if [[ $(ha_state -master-only -timeout 3s 2>/dev/null) == n1 ]]; then first=n0 second=n1; fi
    if want "$first" "$@"; then stop_one "$first" TERM; fi
    if want "$second" "$@"; then stop_one "$second" TERM; fi
    if want namesrv "$@"; then stop_one namesrv TERM; fi
    if (($# == 0)); then log "HA bed stopped; the databases keep running (name them to stop them)"; return 0; fi
  fi
  if want broker-b "$@"; then stop_one broker-b TERM; fi
  if want broker "$@"; then stop_one broker TERM; fi
  if want namesrv "$@"; then stop_one namesrv TERM; fi
  if want mariadb "$@"; then stop_one mariadb TERM; fi
  # SIGINT is PostgreSQL's fast shutdown; SIGTERM waits for every client.
  if want postgres "$@"; then stop_one postgres INT; fi
  return 0
}

cmd_kill9() {
  [[ $# == 1 ]] || die "usage: kill9 broker|broker-b|namesrv|mariadb|postgres (HA bed: master|slave|n0|n1|namesrv)"
  local svc=$1
  if [[ $BROKERS == ha && ($svc == master || $svc == slave) ]]; then
    svc=$(ha_role "$svc")
    log "$1 is $svc"
  fi
  check_names "$svc"
  stop_one "$svc" KILL
}

cmd_status() {
  local s pid port rc=0
  for s in mariadb postgres namesrv $(brokers); do
    case $s in mariadb) port=$MYSQL_PORT ;; postgres) port=$PG_PORT ;; namesrv) port=$NAMESRV_PORT ;; broker | n0) port=$BROKER_PORT ;; broker-b | n1) port=$BROKER_B_PORT ;; esac
    if pid=$(pid_of $s); then
      printf '%-8s running  pid %-7s 127.0.0.1:%s\n' "$s" "$pid" "$port"
    else
      printf '%-8s stopped\n' "$s"; rc=3
    fi
  done
  printf 'run dir  %s\njar cache %s\n' "$RUN_DIR" "$LIB_DIR"
  if [[ $BROKERS == ha ]]; then
    # The controller's view: node, address, role by the controller, role
    # by the broker itself; then the master and the sync state set.
    printf 'controller 127.0.0.1:%s, replica set broker-a:\n' "$CONTROLLER_PORT"
    ha_state -timeout 3s 2>&1 || rc=3
  fi
  if [[ $PG_DIR != "$RUN_DIR/postgres" ]]; then printf 'postgres dir %s\n' "$PG_DIR"; fi
  return $rc
}

cmd_logs() {
  check_names "$@"
  want mariadb "$@" && { echo "== mariadb ($DB_DIR/error.log)"; tail -n "${LINES_:-40}" "$DB_DIR/error.log" 2>/dev/null || true; }
  want postgres "$@" && { echo "== postgres ($PG_DIR/postgres.log)"; tail -n 40 "$PG_DIR/postgres.log" 2>/dev/null || true; }
  want namesrv "$@" && { echo "== namesrv"; tail -n 40 "$RMQ_DIR/logs/namesrv.out" 2>/dev/null || true; }
  if [[ $BROKERS != ha ]] && want broker "$@"; then
    echo "== broker"; tail -n 40 "$RMQ_DIR/logs/broker.out" 2>/dev/null || true
    echo "== broker.log"; tail -n 40 "$RMQ_DIR/logs/rocketmqlogs/broker.log" 2>/dev/null || true
  fi
  if [[ $BROKERS == ha ]]; then
    if want namesrv "$@"; then
      echo "== controller.log"; tail -n 40 "$RMQ_DIR/logs/rocketmqlogs/controller.log" 2>/dev/null || true
    fi
    local n
    for n in n0 n1; do
      want "$n" "$@" || continue
      echo "== $n"; tail -n 40 "$RMQ_DIR/$n/logs/broker.out" 2>/dev/null || true
      echo "== $n broker.log"; tail -n 40 "$RMQ_DIR/$n/logs/rocketmqlogs/broker.log" 2>/dev/null || true
    done
  fi
  if [[ $BROKERS == 2 ]] && want broker-b "$@"; then
    echo "== broker-b"; tail -n 40 "$RMQ_DIR/broker-b/logs/broker.out" 2>/dev/null || true
    echo "== broker-b broker.log"; tail -n 40 "$RMQ_DIR/broker-b/logs/rocketmqlogs/broker.log" 2>/dev/null || true
  fi
  return 0
}

cmd_env() {
  cat <<EOF
export RMQTX_MYSQL_ADDR=127.0.0.1:$MYSQL_PORT
export RMQTX_MYSQL_USER=$MYSQL_USER
export RMQTX_MYSQL_PASSWORD=$MYSQL_PASSWORD
export RMQTX_MYSQL_DATABASE=$MYSQL_DATABASE
export RMQTX_PG_DSN='postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$PG_PORT/$PG_DATABASE?sslmode=disable'
export RMQTX_NAMESRV=127.0.0.1:$NAMESRV_PORT
export RMQTX_BROKER=127.0.0.1:$BROKER_PORT
EOF
  if [[ $BROKERS == 2 ]]; then echo "export RMQTX_BROKER_B=127.0.0.1:$BROKER_B_PORT"; fi
  if [[ $BROKERS == ha ]]; then
    # RMQTX_BROKER above is n0's address; the master may be either.
    echo "export RMQTX_CONTROLLER=127.0.0.1:$CONTROLLER_PORT"
    echo "export RMQTX_HA_N0=127.0.0.1:$BROKER_PORT"
    echo "export RMQTX_HA_N1=127.0.0.1:$BROKER_B_PORT"
  fi
}

case ${1:-} in
  install) ensure_mariadb_installed; ensure_postgres_installed; ensure_jars ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  kill9) shift; cmd_kill9 "$@" ;;
  status) cmd_status ;;
  logs) shift; cmd_logs "$@" ;;
  admin) shift; mqadmin "$@" ;;
  env) cmd_env ;;
  *) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
