# shellcheck shell=bash
# PgBouncer in front of an existing PostgreSQL, for scripts/topologies.sh (pgbouncer-start,
# pgbouncer-node), sourced by it after scripts/topology/common.sh. Layout of DIR:
#   DIR/run/                    pgbouncer.ini, userlist.txt, pgbouncer.{pid,log}
#                               (owned by postgres)
#   DIR/port                    its port on 127.0.0.1

BOUNCER_TIMEOUT=15

pb_run() { echo "$1/run"; }
pb_port() { cat "$1/port"; }

pb_pid() { # pb_pid DIR: the running pgbouncer, if any
    local f pid
    f="$(pb_run "$1")/pgbouncer.pid"
    [ -s "$f" ] || return 1
    pid=$(cat "$f")
    proc_in_dir "$pid" "$1" || return 1
    echo "$pid"
}

# pb_write_config DIR PG_HOST PG_PORT MODE. PgBouncer 1.18 does not track
# prepared statements (max_prepared_statements came in 1.21).
pb_write_config() {
    local dir=$1 host=$2 port=$3 mode=$4 run reset=""
    run=$(pb_run "$dir")
    # Session mode hands a server connection to the next client: clean it.
    if [ "$mode" = session ]; then reset="DISCARD ALL"; fi
    cat >"$run/pgbouncer.ini" <<EOF
; dblock test topology (scripts/topologies.sh): PgBouncer, $mode pooling
[databases]
* = host=$host port=$port

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $(pb_port "$dir")
; no unix socket (the default would be in /tmp)
unix_socket_dir =
auth_type = md5
auth_file = $run/userlist.txt
pool_mode = $mode
default_pool_size = 20
max_client_conn = 200
server_reset_query = $reset
; libpq sends neither by default (dblock sets application_name, which
; PgBouncer supports); JDBC-style clients send extra_float_digits. Ignored
; "options" are NOT applied on the server.
ignore_startup_parameters = extra_float_digits,options
; reconnect fast after the server restarted (defaults: 15 s)
server_login_retry = 1
server_connect_timeout = 5
logfile = $run/pgbouncer.log
pidfile = $run/pgbouncer.pid
EOF
    printf '"%s" "%s"\n' "$DB_USER" "$DB_PASSWORD" >"$run/userlist.txt"
    if is_root; then chown postgres:postgres "$run/pgbouncer.ini" "$run/userlist.txt"; fi
    chmod 600 "$run/userlist.txt"
}

pb_accepts() { # a client gets through PgBouncer to the server
    PGPASSWORD=$DB_PASSWORD PGCONNECT_TIMEOUT=2 "$PG_BIN/psql" -X -q -A -t -h 127.0.0.1 \
        -p "$(pb_port "$1")" -U "$DB_USER" -d "$DB_NAME" -c 'SELECT 1' 2>/dev/null | grep -x 1 >/dev/null
}

# pb_launch DIR: start it (as postgres, daemonized with -d as in the Debian
# package) and wait until it serves queries. The daemon writes its pid file
# only after the launching process returned; a FATAL in the part of the log
# written since the launch (e.g. its port is taken) means it gave up.
pb_launch() {
    local dir=$1 run deadline offset
    run=$(pb_run "$dir")
    rm -f "$run/pgbouncer.pid"
    offset=$(stat -c %s "$run/pgbouncer.log" 2>/dev/null || echo 0)
    as_pg "$PGBOUNCER" -d "$run/pgbouncer.ini" >>"$run/launch.out" 2>&1 || {
        cat "$run/launch.out" >&2
        show_log "$run/pgbouncer.log"
        return 1
    }
    deadline=$(($(date +%s) + BOUNCER_TIMEOUT))
    until pb_accepts "$dir"; do
        if [ "$(date +%s)" -ge "$deadline" ] ||
            tail -c "+$((offset + 1))" "$run/pgbouncer.log" 2>/dev/null | grep ' FATAL ' >/dev/null; then
            show_log "$run/pgbouncer.log"
            msg "PgBouncer on port $(pb_port "$dir") does not serve queries"
            return 1
        fi
        sleep 0.05
    done
}

pb_stop() { # pb_stop DIR TERM|KILL (TERM: immediate shutdown, KILL: a crash)
    local dir=$1 sig=$2 pid
    pid=$(pb_pid "$dir") || return 0
    kill "-$sig" "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" 10; then
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 5 || msg "WARNING: pgbouncer $pid does not die"
    fi
}

cmd_pgbouncer_start() {
    local host=${2:-} port=${3:-} mode=${4:-transaction} t0 attempt
    if [ "$#" -lt 3 ] || [ "$#" -gt 4 ]; then usage; fi
    case "$mode" in
        transaction | session) ;;
        *) die "pool mode must be transaction or session, not '$mode'" ;;
    esac
    [[ "$port" =~ ^[0-9]+$ ]] || die "PG_PORT must be a number, not '$port'"
    PGBOUNCER=$(find_tool pgbouncer)
    "$PG_BIN/pg_isready" -q -h "$host" -p "$port" -t 5 || die "no PostgreSQL answers on $host:$port"
    t0=$(now_ms)
    new_dir "$1" pgbouncer 200
    mkdir -p "$(pb_run "$TOPO_DIR")"
    if is_root; then chown postgres:postgres "$(pb_run "$TOPO_DIR")"; fi
    for attempt in 1 2 3; do
        pick_port "$port" >"$TOPO_DIR/port"
        pb_write_config "$TOPO_DIR" "$host" "$port" "$mode"
        if pb_launch "$TOPO_DIR"; then break; fi
        pb_stop "$TOPO_DIR" KILL
        if [ "$attempt" -lt 3 ] && grep -q 'Address already in use' "$(pb_run "$TOPO_DIR")/pgbouncer.log"; then
            msg "port $(pb_port "$TOPO_DIR") was taken meanwhile; retrying with another"
            continue
        fi
        die "PgBouncer did not start (is PostgreSQL on $host:$port up?)"
    done
    write_exports "$TOPO_DIR" \
        DBLOCK_TEST_PGBOUNCER_DIR "$TOPO_DIR" \
        DBLOCK_TEST_PGBOUNCER_URL \
        "postgresql://$DB_USER:$DB_PASSWORD@127.0.0.1:$(pb_port "$TOPO_DIR")/$DB_NAME" \
        DBLOCK_TEST_PGBOUNCER_POOL_MODE "$mode" \
        DBLOCK_TEST_PGBOUNCER_CMD "$(printf '%q pgbouncer-node %q' "$SCRIPT" "$TOPO_DIR")"
    start_done
    msg "PgBouncer ($mode pooling) on 127.0.0.1:$(pb_port "$TOPO_DIR") in front of" \
        "$host:$port, ready in $(elapsed "$t0")"
}

cmd_pgbouncer_node() {
    local dir sig=${3:-KILL} t0
    [ "$#" -ge 2 ] || usage
    dir=$(realpath -m -- "$1")
    check_dir "$dir" pgbouncer
    PGBOUNCER=$(find_tool pgbouncer)
    t0=$(now_ms)
    case "$2" in
        restart)
            case "$sig" in KILL | TERM) ;; *) die "signal must be KILL or TERM, not '$sig'" ;; esac
            pb_stop "$dir" "$sig"
            pb_launch "$dir" || die "PgBouncer did not come back on port $(pb_port "$dir")"
            msg "PgBouncer restarted (SIG$sig) on 127.0.0.1:$(pb_port "$dir") ($(elapsed "$t0"))"
            ;;
        stop)
            pb_stop "$dir" TERM
            msg "PgBouncer stopped ($(elapsed "$t0"))"
            ;;
        *) usage ;;
    esac
}
