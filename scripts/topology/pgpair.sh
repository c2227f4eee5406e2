# shellcheck shell=bash
# The PostgreSQL 15 primary + streaming standby of scripts/topologies.sh (pgpair-start,
# pgpair-node), sourced by it after scripts/topology/common.sh. Layout of DIR:
#   DIR/pg1, DIR/pg2            data/, postgres.log, port (owned by postgres);
#                               pg1 starts as the primary, pg2 as its standby
#   DIR/sock/                   both servers' unix sockets
#   DIR/mode                    sync or async

REPL_USER=replicator # the standby's replication connection
REPL_PASSWORD=replicator-secret

PG_TIMEOUT=30

pp_data() { echo "$1/pg$2/data"; }
pp_log() { echo "$1/pg$2/postgres.log"; }
pp_sock() { echo "$1/sock"; }
pp_port() { cat "$1/pg$2/port"; }

pp_psql() { # pp_psql DIR N [ARGS]: as postgres over node N's unix socket
    local dir=$1 n=$2
    shift 2
    "$PG_BIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -h "$(pp_sock "$dir")" \
        -p "$(pp_port "$dir" "$n")" -U postgres -d postgres "$@"
}

pp_pid() { # pp_pid DIR N: node N's running postmaster, if any
    local f pid
    f="$(pp_data "$1" "$2")/postmaster.pid"
    [ -f "$f" ] || return 1
    pid=$(head -n 1 "$f")
    proc_alive "$pid" || return 1
    echo "$pid"
}

pp_role() { # pp_role DIR N: primary, standby, down or unreachable
    local answer
    if ! pp_pid "$1" "$2" >/dev/null; then
        echo down
        return
    fi
    answer=$(pp_psql "$1" "$2" -c 'SELECT pg_is_in_recovery()' 2>/dev/null || true)
    case "$answer" in
        f) echo primary ;;
        t) echo standby ;;
        *) echo unreachable ;;
    esac
}

pp_find() { # pp_find DIR ROLE: the node (1 or 2) that is ROLE now
    local n
    for n in 1 2; do
        if [ "$(pp_role "$1" "$n")" = "$2" ]; then
            echo "$n"
            return 0
        fi
    done
    return 1
}

# pp_start_server DIR N: start node N; if its port was taken meanwhile, on a
# new port (later "port" lines in postgresql.conf override earlier ones).
pp_start_server() {
    local dir=$1 n=$2 attempt port
    for attempt in 1 2 3; do
        port=$(pp_port "$dir" "$n")
        echo "port = $port" | as_pg tee -a "$(pp_data "$dir" "$n")/postgresql.conf" >/dev/null
        if as_pg "$PG_BIN/pg_ctl" -w -t "$PG_TIMEOUT" -D "$(pp_data "$dir" "$n")" \
            -l "$(pp_log "$dir" "$n")" start >"$dir/pg$n/pg_ctl.out" 2>&1; then
            return 0
        fi
        if [ "$attempt" -lt 3 ] && grep -q 'Address already in use' "$(pp_log "$dir" "$n")"; then
            pick_port "$(pp_port "$dir" 1)" "$(pp_port "$dir" 2)" >"$dir/pg$n/port"
            : >"$(pp_log "$dir" "$n")"
            msg "port $port was taken meanwhile; retrying pg$n with port $(pp_port "$dir" "$n")"
            continue
        fi
        cat "$dir/pg$n/pg_ctl.out" >&2
        show_log "$(pp_log "$dir" "$n")"
        return 1
    done
}

pp_stop_server() { # pp_stop_server DIR N MODE: pg_ctl stop, then make sure the postmaster is gone
    local dir=$1 n=$2 mode=$3 pid
    pid=$(pp_pid "$dir" "$n") || return 0
    if ! as_pg "$PG_BIN/pg_ctl" -w -t "$PG_TIMEOUT" -D "$(pp_data "$dir" "$n")" -m "$mode" \
        stop >/dev/null 2>&1; then
        msg "pg$n did not stop with -m $mode; sending SIGKILL to postmaster $pid"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    # Backends notice the postmaster's death and exit on their own.
    wait_gone "$pid" 10 || {
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 5 || msg "WARNING: postmaster $pid does not die"
    }
}

pp_stop_all() {
    local dir=$1 n
    # Nothing in DIR survives the stop, so nothing needs a clean shutdown.
    for n in 1 2; do pp_stop_server "$dir" "$n" immediate; done
}

pp_init_primary() {
    local dir=$1 data
    data=$(pp_data "$dir" 1)
    mkdir -p "$dir/pg1" "$dir/pg2" "$(pp_sock "$dir")"
    if is_root; then chown postgres:postgres "$dir/pg1" "$dir/pg2" "$(pp_sock "$dir")"; fi
    # --no-sync only skips initdb's own final fsync; the servers keep fsync = on.
    # 1 MB WAL segments instead of 16 MB: less to write, copy and delete.
    if ! as_pg "$PG_BIN/initdb" -D "$data" -U postgres --auth-local=trust \
        --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync --wal-segsize=1 \
        >"$dir/pg1/initdb.log" 2>&1; then
        show_log "$dir/pg1/initdb.log"
        die "initdb failed"
    fi
    as_pg tee -a "$data/postgresql.conf" >/dev/null <<EOF

# --- dblock test topology (scripts/topologies.sh): primary + streaming standby ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$(pp_sock "$dir")'
fsync = on                 # real durability: the crash and failover tests rely on it
max_connections = 100
shared_buffers = 16MB
wal_level = replica
max_wal_senders = 4
wal_keep_size = 64MB       # the standby catches up without a replication slot
min_wal_size = 4MB
hot_standby = on
# A server starting after a crash or from a base backup first flushes its whole
# data directory: one syncfs() instead of an fsync() per file (4 s here).
recovery_init_sync_method = syncfs
EOF
    # trust on the unix socket (admin access as postgres), passwords on TCP.
    as_pg tee "$data/pg_hba.conf" >/dev/null <<EOF
# TYPE  DATABASE     USER          ADDRESS        METHOD
local   all          all                          trust
local   replication  all                          trust
host    replication  $REPL_USER    127.0.0.1/32   scram-sha-256
host    all          all           127.0.0.1/32   scram-sha-256
EOF
}

pp_create_users() {
    pp_psql "$1" 1 >/dev/null <<EOF
CREATE ROLE $DB_USER LOGIN CREATEDB PASSWORD '$DB_PASSWORD';
CREATE DATABASE $DB_NAME OWNER $DB_USER;
CREATE ROLE $REPL_USER REPLICATION LOGIN PASSWORD '$REPL_PASSWORD';
EOF
}

# The standby: a base backup of the primary; -R writes primary_conninfo (with
# application_name=s1 and the password) and standby.signal.
pp_make_standby() {
    local dir=$1 conninfo
    conninfo="host=127.0.0.1 port=$(pp_port "$dir" 1) user=$REPL_USER application_name=s1"
    if ! as_pg env PGPASSWORD="$REPL_PASSWORD" "$PG_BIN/pg_basebackup" -D "$(pp_data "$dir" 2)" \
        -d "$conninfo" -X stream -R -c fast --no-sync >"$dir/pg2/basebackup.log" 2>&1; then
        show_log "$dir/pg2/basebackup.log"
        die "pg_basebackup failed"
    fi
    grep -q 'application_name=s1' "$(pp_data "$dir" 2)/postgresql.auto.conf" ||
        die "pg_basebackup -R did not keep application_name=s1 in primary_conninfo"
    pp_start_server "$dir" 2 || die "the standby did not start"
}

# pp_wait_replication DIR sync|async: until the primary streams to s1 in
# that sync_state.
pp_wait_replication() {
    local dir=$1 want=$2 deadline got
    deadline=$(($(date +%s) + PG_TIMEOUT))
    while :; do
        got=$(pp_psql "$dir" 1 -c "SELECT sync_state FROM pg_stat_replication
            WHERE application_name = 's1' AND state = 'streaming'" 2>/dev/null || true)
        [ "$got" != "$want" ] || return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            show_log "$(pp_log "$dir" 2)"
            die "the standby is not streaming as $want within ${PG_TIMEOUT}s (sync_state: '${got}')"
        fi
        sleep 0.1
    done
}

pp_exports() {
    local dir=$1 p1 p2 base
    p1=$(pp_port "$dir" 1)
    p2=$(pp_port "$dir" 2)
    base="postgresql://$DB_USER:$DB_PASSWORD@127.0.0.1"
    write_exports "$dir" \
        DBLOCK_TEST_PGPAIR_DIR "$dir" \
        DBLOCK_TEST_PGPAIR_URL "$base:$p1,127.0.0.1:$p2/$DB_NAME?target_session_attrs=read-write" \
        DBLOCK_TEST_PGPAIR_PRIMARY_URL "$base:$p1/$DB_NAME" \
        DBLOCK_TEST_PGPAIR_STANDBY_URL "$base:$p2/$DB_NAME" \
        DBLOCK_TEST_PGPAIR_PRIMARY_ADMIN_URL "postgresql://postgres@127.0.0.1:$p1/$DB_NAME?host=$(pp_sock "$dir")" \
        DBLOCK_TEST_PGPAIR_STANDBY_ADMIN_URL "postgresql://postgres@127.0.0.1:$p2/$DB_NAME?host=$(pp_sock "$dir")" \
        DBLOCK_TEST_PGPAIR_CMD "$(printf '%q pgpair-node %q' "$SCRIPT" "$dir")"
}

cmd_pgpair_start() {
    local mode=${2:-} t0 p1
    [ "$#" -eq 2 ] || usage
    case "$mode" in sync | async) ;; *) die "mode must be sync or async, not '$mode'" ;; esac
    [ -x "$PG_BIN/initdb" ] || die "$PG_BIN/initdb not found (set DBLOCK_TEST_PG_BIN or run scripts/install-deps.sh)"
    t0=$(now_ms)
    # sock/.s.PGSQL.NNNNN must fit into 107 bytes.
    new_dir "$1" pgpair 87
    echo "$mode" >"$TOPO_DIR/mode"
    pp_init_primary "$TOPO_DIR"
    p1=$(pick_port)
    echo "$p1" >"$TOPO_DIR/pg1/port"
    pick_port "$p1" >"$TOPO_DIR/pg2/port"
    pp_start_server "$TOPO_DIR" 1 || die "the primary did not start"
    pp_create_users "$TOPO_DIR"
    pp_make_standby "$TOPO_DIR"
    if [ "$mode" = sync ]; then
        # Only on the primary (the standby's copy is already taken): a promoted
        # standby must not wait for a synchronous standby of its own.
        pp_psql "$TOPO_DIR" 1 >/dev/null <<EOF
ALTER SYSTEM SET synchronous_standby_names = 's1';
ALTER SYSTEM SET synchronous_commit = 'remote_apply';
SELECT pg_reload_conf();
EOF
    fi
    pp_wait_replication "$TOPO_DIR" "$mode"
    pp_exports "$TOPO_DIR"
    start_done
    msg "PostgreSQL primary 127.0.0.1:$(pp_port "$TOPO_DIR" 1) + $mode standby" \
        "127.0.0.1:$(pp_port "$TOPO_DIR" 2) ready in $(elapsed "$t0"), directory $TOPO_DIR"
}

# pp_stop_role DIR primary|standby: pg_ctl -m immediate stop of the node in that role now.
pp_stop_role() {
    local dir=$1 role=$2 n t0
    t0=$(now_ms)
    n=$(pp_find "$dir" "$role") || die "no running $role in $dir"
    pp_stop_server "$dir" "$n" immediate
    msg "$role pg$n (127.0.0.1:$(pp_port "$dir" "$n")) stopped with -m immediate ($(elapsed "$t0"))"
}

pp_promote() { # promote the standby and wait until it accepts writes
    local dir=$1 n t0 deadline
    t0=$(now_ms)
    n=$(pp_find "$dir" standby) || die "no running standby in $dir"
    as_pg "$PG_BIN/pg_ctl" -w -t "$PG_TIMEOUT" -D "$(pp_data "$dir" "$n")" promote >/dev/null ||
        die "pg_ctl promote of pg$n failed"
    deadline=$(($(date +%s) + PG_TIMEOUT))
    until [ "$(pp_role "$dir" "$n")" = primary ]; do
        [ "$(date +%s)" -lt "$deadline" ] || die "pg$n still in recovery ${PG_TIMEOUT}s after promote"
        sleep 0.05
    done
    msg "pg$n (127.0.0.1:$(pp_port "$dir" "$n")) promoted, accepts writes ($(elapsed "$t0"))"
}

# What Patroni or repmgr do when the synchronous standby is gone: the primary stops waiting for
# it. ALTER SYSTEM cannot run in a transaction block: psql sends each statement on its own.
pp_desync() {
    local dir=$1 n
    n=$(pp_find "$dir" primary) || die "no running primary in $dir"
    pp_psql "$dir" "$n" >/dev/null <<EOF
ALTER SYSTEM SET synchronous_standby_names = '';
SELECT pg_reload_conf();
EOF
    msg "pg$n no longer waits for a synchronous standby"
}

pp_status() {
    local dir=$1 n p
    for n in 1 2; do
        echo "pg$n 127.0.0.1:$(pp_port "$dir" "$n") $(pp_role "$dir" "$n")"
    done
    if p=$(pp_find "$dir" primary); then
        pp_psql "$dir" "$p" -F ' ' -c "SELECT 'replication to', application_name, state,
            sync_state FROM pg_stat_replication" || true
    fi
}

cmd_pgpair_node() {
    local dir t0
    [ "$#" -eq 2 ] || usage
    dir=$(realpath -m -- "$1")
    check_dir "$dir" pgpair
    case "$2" in
        failover)
            t0=$(now_ms)
            # Check first: a failover without a standby would only kill the primary.
            pp_find "$dir" standby >/dev/null || die "no running standby in $dir to fail over to"
            pp_stop_role "$dir" primary
            pp_promote "$dir"
            msg "failover done in $(elapsed "$t0")"
            ;;
        kill-primary) pp_stop_role "$dir" primary ;;
        promote) pp_promote "$dir" ;;
        stop-standby) pp_stop_role "$dir" standby ;;
        desync) pp_desync "$dir" ;;
        status) pp_status "$dir" ;;
        *) usage ;;
    esac
}
