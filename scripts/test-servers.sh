#!/usr/bin/env bash
# Throwaway private PostgreSQL 15 and MariaDB servers for the dblock tests.
#
# Both servers live entirely inside one directory (data, sockets, logs, pid
# files), listen only on 127.0.0.1 on random free ports, and never touch the
# system-wide installations or services. Removing the directory after
# stopping the servers leaves nothing behind.
#
# Usage:
#   test-servers.sh run [--] CMD [ARGS...]
#       Start both servers in a fresh temporary directory, export the
#       DBLOCK_TEST_* variables, run CMD, then always stop the servers and
#       delete the directory. Exits with CMD's exit status.
#   test-servers.sh start [DIR]
#       Start both servers (in DIR, or a fresh temporary directory) and leave
#       them running. Prints "export ..." lines on stdout, everything else on
#       stderr, so this works:  eval "$(scripts/test-servers.sh start)"
#   test-servers.sh stop DIR
#       Stop the servers of DIR and remove DIR.
#
# run and start also bring up, with scripts/topologies.sh, a 3-node MariaDB
# Galera cluster in DIR/galera and a transaction-pooling PgBouncer in front of
# the PostgreSQL in DIR/pgbouncer, and export their DBLOCK_TEST_GALERA_* and
# DBLOCK_TEST_PGBOUNCER_* variables (DBLOCK_TEST_TOPOLOGIES=0 skips both, for
# quick local iterations). DBLOCK_TEST_TOPOLOGIES_SCRIPT names topologies.sh,
# for the tests' own topologies (e.g. pgpair-start in a temporary directory).
#
# Single-server control, for fault-injection tests (the exported
# DBLOCK_TEST_*_CMD variables are ready-made calls of these):
#   test-servers.sh pg-start DIR
#   test-servers.sh pg-stop DIR [fast|smart|immediate|kill9]    (default: fast)
#   test-servers.sh pg-restart DIR [fast|smart|immediate|kill9] (default: fast)
#       (kill9: SIGKILL to the postmaster and all its processes, a crash)
#   test-servers.sh mysql-start DIR
#   test-servers.sh mysql-stop DIR [TERM|KILL]             (default: TERM)
#   test-servers.sh mysql-restart DIR [TERM|KILL]          (default: TERM)
#
# A PostgreSQL whose clock can be moved (for the clock-jump fault tests):
#   test-servers.sh pg-faketime-setup DIR TIMESTAMP_FILE
#       Set up and start a PostgreSQL alone in the new (or empty) directory DIR,
#       running under libfaketime (LD_PRELOAD) with its offset read from
#       TIMESTAMP_FILE on every clock call (e.g. "+0", "+1h", "-1h"; rewrite the
#       file to jump). CLOCK_MONOTONIC stays real, as an NTP step leaves it.
#       TIMESTAMP_FILE must be readable by the server's user. Prints
#       "export DBLOCK_TEST_FAKETIME_PG_URL=..."; stop it with: stop DIR
#
# Environment overrides: DBLOCK_TEST_PG_BIN (PostgreSQL bin directory),
# TMPDIR (where the temporary directory is created), DBLOCK_TEST_TOPOLOGIES=0.
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
TOPOLOGIES=$(dirname "$SCRIPT")/topologies.sh
PG_BIN=${DBLOCK_TEST_PG_BIN:-/usr/lib/postgresql/15/bin}

# Fixed test credentials; the tests only ever see them through the URLs.
DB_NAME=dblock_test
DB_USER=dblock
DB_PASSWORD=dblock-secret

# Marker file: "stop" refuses to rm -rf a directory that does not have it,
# so a typo in DIR cannot delete anything else.
MARKER=.dblock-test-servers

PORT_MIN=20000
PORT_MAX=60000

MYSQL_READY_TIMEOUT=60 # seconds until mariadbd must answer a ping
MYSQL_STOP_TIMEOUT=20  # seconds after SIGTERM before SIGKILL
PG_START_TIMEOUT=60
PG_STOP_TIMEOUT=30

msg() { printf 'test-servers: %s\n' "$*" >&2; }
# shellcheck source=scripts/lib.sh
. "$(dirname "$SCRIPT")/lib.sh"

# ---------------------------------------------------------------------------
# Processes

# wait_groups_gone SECONDS PGID...: until no live process is left in the
# given process groups.
wait_groups_gone() {
    local deadline=$(($(date +%s) + $1)) pid live
    shift
    while :; do
        live=0
        for pid in $(pgrep -g "$(
            IFS=,
            echo "$*"
        )" 2>/dev/null || true); do
            if proc_alive "$pid"; then live=1; fi
        done
        [ "$live" -eq 1 ] || return 0
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# ---------------------------------------------------------------------------
# Directory layout. Everything of one server set is below DIR:
#   DIR/pg/data, DIR/pg/postgres.log, DIR/pg/port   (owned by postgres)
#   DIR/pgsock/                                    (PostgreSQL unix socket)
#   DIR/mysql/data, DIR/mysql/mariadbd.{pid,err}, DIR/mysql/port
#   DIR/mysql.sock                                 (MariaDB unix socket)
#   DIR/sqlite/                                    (empty, for SQLite tests)
#   DIR/env.sh                                     (the export lines)

pg_data() { echo "$1/pg/data"; }
pg_log() { echo "$1/pg/postgres.log"; }
pg_sock_dir() { echo "$1/pgsock"; }
my_data() { echo "$1/mysql/data"; }
my_pid_file() { echo "$1/mysql/mariadbd.pid"; }
my_launch_pid_file() { echo "$1/mysql/launch.pid"; }
my_err_log() { echo "$1/mysql/mariadbd.err"; }
my_socket() { echo "$1/mysql.sock"; }

read_port() { # read_port DIR pg|mysql
    local f="$1/$2/port"
    [ -s "$f" ] || die "no port recorded in $f (was the server ever set up?)"
    cat "$f"
}

check_dir() { # the DIR argument of the per-server and stop commands
    local dir=$1
    [ -n "$dir" ] || usage
    [ -d "$dir" ] || die "$dir does not exist"
    [ -e "$dir/$MARKER" ] || die "$dir was not created by test-servers.sh (no $MARKER)"
}

# Show the end of a log, to explain why a server did not come up.
show_log() {
    local file=$1
    if [ -s "$file" ]; then
        msg "---- last lines of $file ----"
        tail -n 30 "$file" >&2
        msg "---- end of $file ----"
    else
        msg "($file is empty or missing)"
    fi
}

# ---------------------------------------------------------------------------
# PostgreSQL

pg_running() {
    local pidfile
    pidfile="$(pg_data "$1")/postmaster.pid"
    [ -f "$pidfile" ] && proc_alive "$(head -n 1 "$pidfile")"
}

pg_start() {
    local dir=$1 t0
    t0=$(now_ms)
    if pg_running "$dir"; then
        msg "PostgreSQL of $dir is already running"
        return 0
    fi
    # All settings live in postgresql.conf (written at setup), so a plain
    # pg_ctl start/restart later brings the server back identically. DIR/pg/env
    # (pg-faketime-setup) holds extra environment variables, one per line.
    local extra_env=()
    if [ -s "$dir/pg/env" ]; then mapfile -t extra_env <"$dir/pg/env"; fi
    if ! as_pg env ${extra_env[@]+"${extra_env[@]}"} "$PG_BIN/pg_ctl" -w -t "$PG_START_TIMEOUT" \
        -D "$(pg_data "$dir")" -l "$(pg_log "$dir")" start >"$dir/pg/pg_ctl.out" 2>&1; then
        cat "$dir/pg/pg_ctl.out" >&2
        show_log "$(pg_log "$dir")"
        msg "PostgreSQL failed to start"
        return 1
    fi
    msg "PostgreSQL up on 127.0.0.1:$(read_port "$dir" pg) ($(elapsed "$t0"))"
}

pg_stop() { # pg_stop DIR [fast|smart|immediate|kill9]
    local dir=$1 mode=${2:-fast} data pid t0
    data=$(pg_data "$dir")
    [ -f "$data/postmaster.pid" ] || return 0
    pid=$(head -n 1 "$data/postmaster.pid")
    proc_alive "$pid" || return 0
    t0=$(now_ms)
    if [ "$mode" = kill9 ]; then
        # A crash: SIGKILL to the postmaster and every server process at once (the WAL writer
        # among them, so what it had not flushed yet is lost), then wait until all are gone;
        # the next start runs crash recovery (and empties UNLOGGED tables).
        local kids
        kids=$(pgrep -P "$pid" || true)
        # shellcheck disable=SC2086
        kill -KILL "$pid" $kids 2>/dev/null || true
        for k in $pid $kids; do wait_gone "$k" 10 || msg "WARNING: server process $k does not die"; done
        # A killed postmaster may linger as a zombie until its parent reaps it, and the next
        # postmaster would take the pid in its lock files for a live server: they go now.
        rm -f "$data/postmaster.pid" "$(pg_sock_dir "$dir")"/.s.PGSQL.*.lock
        msg "PostgreSQL killed (SIGKILL, $(elapsed "$t0"))"
        return 0
    fi
    if ! as_pg "$PG_BIN/pg_ctl" -w -t "$PG_STOP_TIMEOUT" -D "$data" -m "$mode" stop >/dev/null 2>&1; then
        msg "PostgreSQL did not stop with -m $mode; trying -m immediate"
        if ! as_pg "$PG_BIN/pg_ctl" -w -t 10 -D "$data" -m immediate stop >/dev/null 2>&1; then
            msg "PostgreSQL still running; sending SIGKILL to postmaster $pid"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    # pg_ctl only waits for the pid file to vanish; make sure the postmaster
    # process itself is really gone before anyone deletes its data directory.
    # Backends notice the postmaster's death and exit on their own.
    wait_gone "$pid" 10 || {
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 5 || msg "WARNING: postmaster $pid does not die"
    }
    msg "PostgreSQL stopped (-m $mode, $(elapsed "$t0"))"
}

pg_restart() { # pg_restart DIR [mode]
    pg_stop "$1" "${2:-fast}"
    pg_start "$1"
}

setup_pg() {
    local dir=$1 port attempt t0
    t0=$(now_ms)
    [ -x "$PG_BIN/initdb" ] || die "$PG_BIN/initdb not found (set DBLOCK_TEST_PG_BIN or run scripts/install-deps.sh)"
    mkdir -p "$dir/pg" "$(pg_sock_dir "$dir")"
    if is_root; then
        chown postgres:postgres "$dir/pg" "$(pg_sock_dir "$dir")"
    fi
    # trust on the unix socket (admin access as postgres), scram on TCP so
    # that a wrong password really fails. --no-sync only skips initdb's own
    # final fsync; the running server keeps fsync=on.
    if ! as_pg "$PG_BIN/initdb" -D "$(pg_data "$dir")" -U postgres \
        --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --locale=C --no-sync >"$dir/pg/initdb.log" 2>&1; then
        show_log "$dir/pg/initdb.log"
        die "initdb failed"
    fi
    as_pg tee -a "$(pg_data "$dir")/postgresql.conf" >/dev/null <<EOF

# --- dblock test server (scripts/test-servers.sh) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$(pg_sock_dir "$dir")'
fsync = on
max_connections = 200
EOF
    port=$(cat "$dir/pg/port")
    for attempt in 1 2 3; do
        # Later "port" lines override earlier ones, so a retry just appends.
        echo "port = $port" | as_pg tee -a "$(pg_data "$dir")/postgresql.conf" >/dev/null
        echo "$port" >"$dir/pg/port"
        if pg_start "$dir"; then
            break
        fi
        if [ "$attempt" -lt 3 ] && grep -q 'Address already in use' "$(pg_log "$dir")" 2>/dev/null; then
            port=$(pick_port "$(cat "$dir/mysql/port" 2>/dev/null || true)")
            : >"$(pg_log "$dir")" # so the next attempt is judged on its own log
            msg "PostgreSQL port was taken meanwhile; retrying with port $port"
            continue
        fi
        die "could not start PostgreSQL"
    done
    # Not a superuser: the tests must work with ordinary privileges. Admin
    # things (pg_terminate_backend on other users, restarts) go through the
    # postgres superuser on the unix socket instead.
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$(pg_sock_dir "$dir")" -p "$port" \
        -U postgres -d postgres >/dev/null <<EOF
CREATE ROLE $DB_USER LOGIN CREATEDB PASSWORD '$DB_PASSWORD';
CREATE DATABASE $DB_NAME OWNER $DB_USER;
EOF
    msg "PostgreSQL ready: database $DB_NAME, user $DB_USER ($(elapsed "$t0") total)"
}

# ---------------------------------------------------------------------------
# MariaDB

my_server_pid() { # the running mariadbd of DIR, if any
    local dir=$1 pid f
    for f in "$(my_pid_file "$dir")" "$(my_launch_pid_file "$dir")"; do
        [ -s "$f" ] || continue
        pid=$(cat "$f")
        if proc_in_dir "$pid" "$dir"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

my_ping() {
    "$MARIADB_ADMIN" --no-defaults --socket="$(my_socket "$1")" -uroot \
        --connect-timeout=2 ping >/dev/null 2>&1
}

my_start() {
    local dir=$1 port pid deadline t0
    t0=$(now_ms)
    if my_server_pid "$dir" >/dev/null; then
        msg "MariaDB of $dir is already running"
        return 0
    fi
    port=$(read_port "$dir" mysql)
    local args=(--no-defaults)
    # mariadbd refuses to run as root unless told to; as a normal user
    # --user would only produce a warning.
    if is_root; then args+=(--user=root); fi
    args+=(
        --datadir="$(my_data "$dir")"
        --socket="$(my_socket "$dir")"
        --port="$port"
        --bind-address=127.0.0.1
        --pid-file="$(my_pid_file "$dir")"
        --log-error="$(my_err_log "$dir")"
        --skip-name-resolve
        --max-connections=300
        --innodb-buffer-pool-size=128M
    )
    # setsid: own session, so a Ctrl-C in the terminal does not hit the server
    # behind our back; we stop it ourselves, in order. No inherited stdout:
    # otherwise $(test-servers.sh start) would wait for mariadbd to exit.
    setsid "$MARIADBD" "${args[@]}" </dev/null >>"$dir/mysql/mariadbd.out" 2>&1 &
    pid=$!
    echo "$pid" >"$(my_launch_pid_file "$dir")"
    deadline=$(($(date +%s) + MYSQL_READY_TIMEOUT))
    until my_ping "$dir"; do
        if ! proc_alive "$pid"; then
            show_log "$(my_err_log "$dir")"
            msg "mariadbd exited during startup"
            return 1
        fi
        if [ "$(date +%s)" -ge "$deadline" ]; then
            show_log "$(my_err_log "$dir")"
            msg "mariadbd did not answer a ping within ${MYSQL_READY_TIMEOUT}s"
            my_stop "$dir" KILL
            return 1
        fi
        sleep 0.1
    done
    msg "MariaDB up on 127.0.0.1:$port ($(elapsed "$t0"))"
}

my_stop() { # my_stop DIR [TERM|KILL]
    local dir=$1 sig=${2:-TERM} pid t0
    pid=$(my_server_pid "$dir") || return 0
    t0=$(now_ms)
    kill "-$sig" "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$MYSQL_STOP_TIMEOUT"; then
        msg "mariadbd $pid ignored SIG$sig for ${MYSQL_STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || msg "WARNING: mariadbd $pid does not die"
    fi
    msg "MariaDB stopped (SIG$sig, $(elapsed "$t0"))"
}

my_restart() {
    my_stop "$1" "${2:-TERM}"
    my_start "$1"
}

my_sql() { # my_sql DIR: run SQL from stdin as root over the unix socket
    "$MARIADB" --no-defaults --socket="$(my_socket "$1")" -uroot --batch
}

setup_mysql() {
    local dir=$1 attempt port t0
    t0=$(now_ms)
    mkdir -p "$dir/mysql"
    local args=(--no-defaults --datadir="$(my_data "$dir")"
        --auth-root-authentication-method=normal --skip-test-db)
    if is_root; then args+=(--user=root); fi
    if ! "$MARIADB_INSTALL_DB" "${args[@]}" >"$dir/mysql/install-db.log" 2>&1; then
        show_log "$dir/mysql/install-db.log"
        die "mariadb-install-db failed"
    fi
    for attempt in 1 2 3; do
        if my_start "$dir"; then
            break
        fi
        if [ "$attempt" -lt 3 ] && grep -q 'Address already in use' "$(my_err_log "$dir")" 2>/dev/null; then
            port=$(pick_port "$(cat "$dir/pg/port" 2>/dev/null || true)")
            echo "$port" >"$dir/mysql/port"
            : >"$(my_err_log "$dir")" # so the next attempt is judged on its own log
            msg "MariaDB port was taken meanwhile; retrying with port $port"
            continue
        fi
        die "could not start MariaDB"
    done
    my_sql "$dir" <<EOF
CREATE DATABASE $DB_NAME DEFAULT CHARACTER SET utf8mb4;
CREATE USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
CREATE USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
GRANT PROCESS ON *.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
EOF
    # CONNECTION ADMIN lets the tests KILL other sessions, e.g. to simulate a
    # lost connection. It exists since MariaDB 10.5.2; on older servers the
    # tests that need it have to cope without.
    if ! my_sql "$dir" >/dev/null 2>"$dir/mysql/grant.err" <<EOF; then
GRANT CONNECTION ADMIN ON *.* TO '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost';
EOF
        msg "NOTE: this MariaDB does not accept CONNECTION ADMIN ($(cat "$dir/mysql/grant.err")); skipped"
    fi
    msg "MariaDB ready: database $DB_NAME, user $DB_USER ($(elapsed "$t0") total)"
}

# ---------------------------------------------------------------------------
# Whole server sets

# Write DIR/env.sh: the variables the tests read. The *_CMD values are shell
# command strings (for system()/sh -c); the stop/restart ones accept one
# extra argument (pg: fast|smart|immediate, mysql: TERM|KILL).
write_env() {
    local dir=$1 pg_port my_port self qdir name value
    pg_port=$(read_port "$dir" pg)
    my_port=$(read_port "$dir" mysql)
    self=$(printf '%q' "$SCRIPT")
    qdir=$(printf '%q' "$dir")
    set -- \
        DBLOCK_TEST_SERVERS_DIR "$dir" \
        DBLOCK_TEST_POSTGRESQL_URL "postgresql://$DB_USER:$DB_PASSWORD@127.0.0.1:$pg_port/$DB_NAME" \
        DBLOCK_TEST_MYSQL_URL "mysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$my_port/$DB_NAME" \
        DBLOCK_TEST_SQLITE_DIR "$dir/sqlite" \
        DBLOCK_TEST_POSTGRESQL_ADMIN_URL "postgresql://postgres@127.0.0.1:$pg_port/$DB_NAME?host=$(pg_sock_dir "$dir")" \
        DBLOCK_TEST_MYSQL_ADMIN_URL "mysql://root@localhost/$DB_NAME?unix_socket=$(my_socket "$dir")" \
        DBLOCK_TEST_PG_BIN "$PG_BIN" \
        DBLOCK_TEST_PG_DATA "$(pg_data "$dir")" \
        DBLOCK_TEST_PG_LOG "$(pg_log "$dir")" \
        DBLOCK_TEST_PG_START_CMD "$self pg-start $qdir" \
        DBLOCK_TEST_PG_STOP_CMD "$self pg-stop $qdir" \
        DBLOCK_TEST_PG_RESTART_CMD "$self pg-restart $qdir" \
        DBLOCK_TEST_MYSQL_PID_FILE "$(my_pid_file "$dir")" \
        DBLOCK_TEST_MYSQL_SOCKET "$(my_socket "$dir")" \
        DBLOCK_TEST_MYSQL_ERROR_LOG "$(my_err_log "$dir")" \
        DBLOCK_TEST_MYSQL_START_CMD "$self mysql-start $qdir" \
        DBLOCK_TEST_MYSQL_STOP_CMD "$self mysql-stop $qdir" \
        DBLOCK_TEST_MYSQL_RESTART_CMD "$self mysql-restart $qdir" \
        DBLOCK_TEST_TOPOLOGIES_SCRIPT "$TOPOLOGIES"
    # Single quotes (with ' escaped as '\'') keep the lines readable and valid
    # for both eval and source.
    : >"$dir/env.sh"
    while [ "$#" -gt 0 ]; do
        name=$1 value=$2
        shift 2
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}" >>"$dir/env.sh"
    done
    # The topologies' own export lines (see start_topologies).
    for name in galera pgbouncer; do
        if [ -s "$dir/$name.env" ]; then cat "$dir/$name.env" >>"$dir/env.sh"; fi
    done
}

SETUP_PIDS=()

# Kill server processes of DIR that the pid files do not know about (e.g. a
# server launched just as setup was interrupted): processes whose command
# line names the directory. Only these server/tool names, so unrelated
# processes that merely mention the path (an editor, this script) survive.
# Postgres backends do not show the path, but exit by themselves once their
# postmaster is gone.
sweep_leftovers() {
    local dir=$1 pid comm leftovers=()
    for pid in $(pgrep -f -- "$dir/" 2>/dev/null || true); do
        comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
        case "$comm" in
            postgres | postmaster | pg_ctl | initdb | mariadbd | mysqld | mariadb-install* | mysql_install_d* | pgbouncer)
                if proc_alive "$pid"; then leftovers+=("$pid"); fi
                ;;
        esac
    done
    [ "${#leftovers[@]}" -gt 0 ] || return 0
    msg "WARNING: killing leftover processes: ${leftovers[*]}"
    kill -KILL "${leftovers[@]}" 2>/dev/null || true
    for pid in "${leftovers[@]}"; do wait_gone "$pid" 5 || true; done
}

# Stop everything belonging to DIR and (unless KEEP_DIR=1) delete DIR. Must
# work from any half-started state, and must not leave processes behind.
teardown() {
    local dir=$1 keep_dir=${2:-0} pid t0 interrupted=0
    t0=$(now_ms)
    # Setup helpers still running (we were interrupted during start): kill
    # their whole process group (each runs under setsid), which includes any
    # initdb / mariadb-install-db / pg_ctl they started.
    if [ "${#SETUP_PIDS[@]}" -gt 0 ]; then
        interrupted=1
        for pid in "${SETUP_PIDS[@]}"; do
            kill -TERM -- "-$pid" 2>/dev/null || true
        done
        # runuser answers SIGTERM by waiting up to 2 s for its child before
        # killing it; wait for the groups to be really empty.
        if ! wait_groups_gone 5 "${SETUP_PIDS[@]}"; then
            for pid in "${SETUP_PIDS[@]}"; do
                kill -KILL -- "-$pid" 2>/dev/null || true
            done
            wait_groups_gone 5 "${SETUP_PIDS[@]}" || msg "WARNING: setup processes do not die"
        fi
        for pid in "${SETUP_PIDS[@]}"; do
            wait "$pid" 2>/dev/null || true
        done
        SETUP_PIDS=()
    fi
    [ -d "$dir" ] || return 0
    stop_topologies "$dir"
    pg_stop "$dir" fast || msg "WARNING: stopping PostgreSQL failed"
    my_stop "$dir" TERM || msg "WARNING: stopping MariaDB failed"
    wait_topologies_stopped
    sweep_leftovers "$dir"
    if [ "$interrupted" -eq 1 ]; then
        # A server may have been forked in the instant before its helper
        # died and only now shows up under its own name.
        sleep 0.5
        pg_stop "$dir" immediate || true
        my_stop "$dir" KILL || true
        sweep_leftovers "$dir"
    fi
    if [ "$keep_dir" -eq 1 ]; then
        msg "servers of $dir stopped ($(elapsed "$t0"))"
        return 0
    fi
    if [ -e "$dir/$MARKER" ]; then
        rm -rf -- "$dir"
        msg "servers stopped, $dir removed ($(elapsed "$t0"))"
    else
        msg "WARNING: $dir has no $MARKER; servers stopped but directory NOT deleted"
    fi
}

validate_dir_name() {
    case "$1" in
        # The path ends up inside URLs and server command lines; keep it
        # to characters that need no escaping anywhere.
        /*) ;;
        *) die "directory path must be absolute: $1" ;;
    esac
    case "$1" in
        *[!A-Za-z0-9_./-]*) die "directory path must only contain [A-Za-z0-9_./-]: $1" ;;
    esac
    # Unix socket paths are limited to 107 bytes (.s.PGSQL.NNNNN is appended).
    [ "${#1}" -le 80 ] || die "directory path too long for unix sockets (max 80 chars): $1"
}

topologies_enabled() { [ "${DBLOCK_TEST_TOPOLOGIES:-1}" != 0 ]; }

# start_topologies DIR galera|pgbouncer: a topologies.sh start as one more
# setup helper (own session, killed by teardown like the others); its export
# lines go to DIR/NAME.env for write_env.
start_topologies() {
    local dir=$1 name=$2
    topologies_enabled || return 0
    case "$name" in
        galera) setsid "$SCRIPT" _start-galera "$dir" >"$dir/galera.env" & ;;
        pgbouncer)
            setsid "$TOPOLOGIES" pgbouncer-start "$dir/pgbouncer" 127.0.0.1 \
                "$(read_port "$dir" pg)" transaction >"$dir/pgbouncer.env" &
            ;;
    esac
    SETUP_PIDS+=($!)
}

# The Galera cluster, tried twice: a port picked as free can be taken (by an outgoing
# connection's ephemeral port) before the node binds it, and the joiner then aborts.
start_galera() {
    local dir=$1
    "$TOPOLOGIES" galera-start "$dir/galera" && return 0
    msg "Galera start failed; trying once more with fresh ports"
    if [ -e "$dir/galera" ]; then
        "$TOPOLOGIES" stop "$dir/galera" >/dev/null 2>&1 || rm -rf "$dir/galera"
    fi
    "$TOPOLOGIES" galera-start "$dir/galera"
}

TOPOLOGY_STOP_PID=

# Stop the topologies of DIR: PgBouncer at once (before its PostgreSQL), the
# Galera cluster (and the removal of its data) in the background while the
# servers stop; wait_topologies_stopped waits for that.
stop_topologies() {
    local dir=$1
    if [ -e "$dir/pgbouncer" ]; then
        "$TOPOLOGIES" stop "$dir/pgbouncer" || msg "WARNING: stopping PgBouncer failed"
    fi
    if [ -e "$dir/galera" ]; then
        "$TOPOLOGIES" stop "$dir/galera" &
        TOPOLOGY_STOP_PID=$!
    fi
}

wait_topologies_stopped() {
    [ -n "$TOPOLOGY_STOP_PID" ] || return 0
    wait "$TOPOLOGY_STOP_PID" || msg "WARNING: stopping the Galera cluster failed"
    TOPOLOGY_STOP_PID=
}

# Start both servers in the (empty) directory DIR; on success DIR/env.sh exists.
setup_all() {
    local dir=$1 pg_port my_port rc=0 t0 pid
    t0=$(now_ms)
    validate_dir_name "$dir"
    touch "$dir/$MARKER"
    # The postgres user must be able to reach its data dir below DIR.
    chmod 755 "$dir"
    if is_root && ! runuser -u postgres -- test -x "$dir"; then
        die "user postgres cannot access $dir (a parent directory is not world-searchable?); set TMPDIR to e.g. /tmp"
    fi
    mkdir -p "$dir/pg" "$dir/mysql" "$dir/sqlite"
    pg_port=$(pick_port)
    my_port=$(pick_port "$pg_port")
    echo "$pg_port" >"$dir/pg/port"
    echo "$my_port" >"$dir/mysql/port"

    # Both servers in parallel: each takes a couple of seconds. Each helper
    # runs in its own session (setsid) so teardown can kill it and all of its
    # children at once, and writes only to stderr (see my_start). PgBouncer
    # and then the Galera cluster start once both servers listen: started
    # alongside, a topology could pick a port a server has picked but not yet
    # bound.
    setsid "$SCRIPT" _setup-pg "$dir" >&2 &
    SETUP_PIDS+=($!)
    setsid "$SCRIPT" _setup-mysql "$dir" >&2 &
    SETUP_PIDS+=($!)
    for pid in "${SETUP_PIDS[@]}"; do
        wait "$pid" || rc=1
    done
    SETUP_PIDS=()
    local name
    for name in pgbouncer galera; do
        [ "$rc" -eq 0 ] || break
        start_topologies "$dir" "$name"
        if [ "${#SETUP_PIDS[@]}" -gt 0 ]; then
            wait "${SETUP_PIDS[0]}" || rc=1
        fi
        SETUP_PIDS=()
    done
    [ "$rc" -eq 0 ] || die "server setup failed (see messages above)"
    write_env "$dir"
    msg "all servers ready in $(elapsed "$t0"), directory $dir"
}

init_tools() {
    MARIADBD=$(find_tool mariadbd)
    MARIADB=$(find_tool mariadb)
    MARIADB_ADMIN=$(find_tool mariadb-admin)
    MARIADB_INSTALL_DB=$(find_tool mariadb-install-db)
}

new_temp_dir() {
    mktemp -d "${TMPDIR:-/tmp}/dblock-test.XXXXXX"
}

# ---------------------------------------------------------------------------
# Commands

CMD_PID=

# INT/TERM while CMD runs: pass the signal on to CMD (it may have been sent
# to us alone, e.g. by a CI timeout), give it time to finish (escalating to
# TERM, then KILL), then exit with the conventional status, which runs the
# EXIT trap (teardown).
on_signal() {
    local sig=$1 status=$2 next
    if [ -n "$CMD_PID" ] && proc_alive "$CMD_PID"; then
        msg "got SIG$sig; passing it on to the command (pid $CMD_PID)"
        kill "-$sig" "$CMD_PID" 2>/dev/null || true
        for next in TERM KILL; do
            wait_gone "$CMD_PID" 10 && break
            msg "command still running after 10s; sending SIG$next"
            kill "-$next" "$CMD_PID" 2>/dev/null || true
        done
    fi
    exit "$status"
}

cmd_run() {
    [ "${1:-}" != "--" ] || shift
    [ "$#" -gt 0 ] || usage
    DIR=$(new_temp_dir)
    touch "$DIR/$MARKER" # ours: teardown may delete it
    # From here on the servers are stopped and DIR removed however we exit:
    # normally, on CMD failure, on a failed start, or on Ctrl-C / kill.
    # During teardown further signals are ignored so a second Ctrl-C cannot
    # leave half-stopped servers behind.
    trap 'trap "" INT TERM; teardown "$DIR"' EXIT
    trap 'on_signal INT 130' INT
    trap 'on_signal TERM 143' TERM
    setup_all "$DIR"
    # shellcheck source=/dev/null
    source "$DIR/env.sh"
    # CMD runs in the background so that "wait" (unlike a foreground command)
    # is interrupted by our signal traps. Bash starts background jobs of a
    # script with stdin from /dev/null and SIGINT/SIGQUIT ignored; "<&0" and
    # "env --default-signal" undo both, so CMD behaves like a foreground
    # command: it stays in our process group and a Ctrl-C in the terminal
    # reaches it (and ctest's children) directly.
    local rc=0
    env --default-signal=INT,QUIT -- "$@" <&0 &
    CMD_PID=$!
    wait "$CMD_PID" || rc=$?
    CMD_PID=
    if [ "$rc" -ne 0 ]; then msg "command exited with status $rc"; fi
    exit "$rc"
}

cmd_start() {
    local created=0
    if [ -n "${1:-}" ]; then
        DIR=$(realpath -m -- "$1")
        validate_dir_name "$DIR"
        if [ -e "$DIR" ]; then
            [ -d "$DIR" ] || die "$DIR exists and is not a directory"
            [ -z "$(ls -A "$DIR")" ] || die "$DIR is not empty"
        else
            mkdir -p "$DIR"
            created=1
        fi
    else
        DIR=$(new_temp_dir)
        created=1
    fi
    touch "$DIR/$MARKER"
    # A failed or interrupted start must not leave servers running; the
    # directory itself is only removed if we created it.
    trap 'trap "" INT TERM; start_failed' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    start_failed() {
        if [ "$created" -eq 1 ]; then
            teardown "$DIR"
        else
            teardown "$DIR" 1
        fi
    }
    setup_all "$DIR"
    trap - EXIT INT TERM
    cat "$DIR/env.sh"
    msg "servers keep running; stop them with: $SCRIPT stop $DIR"
}

cmd_pg_faketime_setup() {
    local dir=${1:-} ts=${2:-} lib=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 port
    if [ -z "$dir" ] || [ -z "$ts" ]; then usage; fi
    [ -r "$lib" ] || die "libfaketime not found at $lib"
    ts=$(realpath -m -- "$ts")
    [ -r "$ts" ] || die "timestamp file $ts is not readable"
    dir=$(realpath -m -- "$dir")
    validate_dir_name "$dir"
    if [ -e "$dir" ]; then
        if [ ! -d "$dir" ] || [ -n "$(ls -A "$dir")" ]; then die "$dir is not an empty directory"; fi
    fi
    mkdir -p "$dir/pg"
    touch "$dir/$MARKER"
    chmod 755 "$dir"
    if is_root && ! runuser -u postgres -- test -r "$ts"; then
        die "user postgres cannot read $ts"
    fi
    trap 'trap "" INT TERM; teardown "$dir"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    printf '%s\n' "LD_PRELOAD=$lib" "FAKETIME_TIMESTAMP_FILE=$ts" FAKETIME_NO_CACHE=1 \
        FAKETIME_DONT_FAKE_MONOTONIC=1 DONT_FAKE_MONOTONIC=1 >"$dir/pg/env"
    pick_port >"$dir/pg/port"
    setup_pg "$dir"
    trap - EXIT INT TERM
    port=$(read_port "$dir" pg)
    printf "export DBLOCK_TEST_FAKETIME_PG_URL='%s'\n" \
        "postgresql://$DB_USER:$DB_PASSWORD@127.0.0.1:$port/$DB_NAME"
    msg "faketime PostgreSQL keeps running; stop it with: $SCRIPT stop $dir"
}

cmd_stop() {
    local dir=${1:-}
    [ -n "$dir" ] || usage
    dir=$(realpath -m -- "$dir")
    if [ ! -e "$dir" ]; then
        msg "$dir does not exist; nothing to stop"
        return 0
    fi
    check_dir "$dir"
    teardown "$dir"
}

main() {
    local cmd=${1:-}
    [ -n "$cmd" ] || usage
    shift
    init_tools
    case "$cmd" in
        run) cmd_run "$@" ;;
        start) cmd_start "$@" ;;
        stop) cmd_stop "$@" ;;
        pg-start) check_dir "${1:-}" && pg_start "$1" ;;
        pg-stop) check_dir "${1:-}" && pg_stop "$1" "${2:-fast}" ;;
        pg-restart) check_dir "${1:-}" && pg_restart "$1" "${2:-fast}" ;;
        mysql-start) check_dir "${1:-}" && my_start "$1" ;;
        mysql-stop) check_dir "${1:-}" && my_stop "$1" "${2:-TERM}" ;;
        mysql-restart) check_dir "${1:-}" && my_restart "$1" "${2:-TERM}" ;;
        pg-faketime-setup) cmd_pg_faketime_setup "$@" ;;
        # Internal: run by setup_all under setsid.
        _setup-pg) setup_pg "$1" ;;
        _setup-mysql) setup_mysql "$1" ;;
        _start-galera) start_galera "$1" ;;
        -h | --help | help) usage ;;
        *)
            msg "unknown command: $cmd"
            usage
            ;;
    esac
}

main "$@"
