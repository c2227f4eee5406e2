#!/usr/bin/env bash
# Throwaway replicated and pooled database topologies for the dblock tests: a
# 3-node MariaDB Galera cluster, a PostgreSQL 15 primary with a streaming
# standby, and PgBouncer in front of an existing PostgreSQL.
#
# Like scripts/test-servers.sh, each topology lives entirely inside one
# directory DIR (data, configs, sockets, logs, pid files) that holds a marker
# file, listens only on 127.0.0.1 on random free ports, and never touches the
# system-wide installations or services. DIR must not exist or be empty.
# "stop DIR" ends every process the topology started, then removes DIR.
#
# Usage:
#   topologies.sh galera-start DIR
#       Three MariaDB Galera nodes: node 1 bootstraps, nodes 2 and 3 join.
#       Returns when all three are Synced in a primary component of size 3.
#   topologies.sh galera-node DIR kill N       SIGKILL node N (1-3), wait until it is gone
#   topologies.sh galera-node DIR start N [CLOCK_OFFSET]
#                                              start node N again; it rejoins (IST or SST);
#                                              with CLOCK_OFFSET (seconds, e.g. +0.3 or -1.5)
#                                              its wall clock runs that far off (libfaketime;
#                                              the monotonic clock stays real)
#                                              and is Synced with every running node
#   topologies.sh galera-node DIR wait-size K  wait until the running nodes are Synced in
#                                              a primary component of size K
#   topologies.sh galera-node DIR status       per node: up/down, cluster size, state
#   topologies.sh pgpair-start DIR sync|async
#       PostgreSQL primary (pg1) and a standby (pg2) streaming from it as
#       application_name s1; "sync" makes s1 the synchronous standby with
#       synchronous_commit = remote_apply.
#   topologies.sh pgpair-node DIR failover      kill-primary, then promote
#   topologies.sh pgpair-node DIR kill-primary  pg_ctl -m immediate stop of the primary
#   topologies.sh pgpair-node DIR promote       promote the standby, wait until writable
#   topologies.sh pgpair-node DIR stop-standby  pg_ctl -m immediate stop of the standby (a
#                                              synchronous primary's COMMITs then wait for ever)
#   topologies.sh pgpair-node DIR desync        on the primary, as a failover manager does:
#                                              synchronous_standby_names = '', reloaded
#   topologies.sh pgpair-node DIR status        per node: port and role
#   topologies.sh pgbouncer-start DIR PG_HOST PG_PORT [transaction|session]
#       PgBouncer in front of PG_HOST:PG_PORT (pool mode default: transaction).
#   topologies.sh pgbouncer-node DIR restart [KILL|TERM]  kill (default SIGKILL) and
#                                              start again on the same port
#   topologies.sh pgbouncer-node DIR stop
#   topologies.sh stop DIR
#       Stop whatever runs in DIR, wait for its processes to exit, remove DIR.
#
# The *-start commands print "export ..." lines on stdout (also kept in
# DIR/env.sh), everything else on stderr, so this works:
#   eval "$(scripts/topologies.sh pgpair-start /tmp/pair sync)"
# Database dblock_test, user dblock, password dblock-secret everywhere.
#
# Environment overrides: DBLOCK_TEST_PG_BIN (PostgreSQL bin directory),
# DBLOCK_TEST_GALERA_LIB (the Galera provider library).
set -euo pipefail

SCRIPT=$(readlink -f "${BASH_SOURCE[0]}")
PG_BIN=${DBLOCK_TEST_PG_BIN:-/usr/lib/postgresql/15/bin}
GALERA_LIB=${DBLOCK_TEST_GALERA_LIB:-/usr/lib/galera/libgalera_smm.so}
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1

# Fixed test credentials, the same as test-servers.sh's.
DB_NAME=dblock_test
DB_USER=dblock
DB_PASSWORD=dblock-secret
REPL_USER=replicator # the PostgreSQL standby's replication connection
REPL_PASSWORD=replicator-secret

# Marker file: "stop" refuses to rm -rf a directory that does not have it.
MARKER=.dblock-topology

PORT_MIN=20000
PORT_MAX=60000

GALERA_SYNC_TIMEOUT=120 # a full state transfer (SST) alone takes over 10 s
GALERA_STOP_TIMEOUT=60  # seconds after SIGTERM before SIGKILL
PG_TIMEOUT=30
BOUNCER_TIMEOUT=15

# Galera's group communication, tuned for tests on loopback. A killed node is
# suspected after 3 s and dropped from the view (the defaults take 5-15 s).
# The rules: suspect_timeout < inactive_timeout <= install_timeout, and
# keepalive_period well below suspect_timeout. join_retrans_period 0.2 s
# (default 1 s) lets a joining node into the view within a fraction of a
# second instead of about 3 s. pc.weight stays at its default (1 per node),
# so any two of the three nodes are a majority.
GALERA_EVS="evs.keepalive_period=PT1S;evs.suspect_timeout=PT3S"
GALERA_EVS+=";evs.inactive_timeout=PT6S;evs.install_timeout=PT6S;evs.join_retrans_period=PT0.2S"

msg() { printf 'topologies: %s\n' "$*" >&2; }
die() {
    msg "ERROR: $*"
    exit 1
}

usage() {
    sed -n '/^# Usage:/,/^set -euo/p' "$SCRIPT" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

now_ms() { date +%s%3N; }
elapsed() { # elapsed START_MS -> "1.234s"
    local ms=$(($(now_ms) - $1))
    printf '%d.%03ds' $((ms / 1000)) $((ms % 1000))
}

is_root() { [ "$(id -u)" -eq 0 ]; }

# PostgreSQL and PgBouncer refuse to run as root: as root, their tools run as
# the "postgres" system user (cd / first: they fail on an unreadable cwd).
as_pg() {
    if is_root; then
        (cd / && runuser -u postgres -- "$@")
    else
        (cd / && "$@")
    fi
}

find_tool() { # find_tool NAME: also look in sbin, which non-root PATHs lack
    local name=$1 dir
    if command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
        return
    fi
    for dir in /usr/sbin /usr/local/sbin /sbin; do
        if [ -x "$dir/$name" ]; then
            echo "$dir/$name"
            return
        fi
    done
    die "$name not found; run scripts/install-deps.sh"
}

# ---------------------------------------------------------------------------
# Processes (as in test-servers.sh)

# True if PID exists and is not a zombie (orphans re-parented to a PID 1 that
# does not reap them stay zombies; they must not count as running).
proc_alive() {
    local pid=$1 stat
    [ -n "$pid" ] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [ "${stat%% *}" != Z ]
}

# True if PID is alive and its command line mentions the directory PATH (so a
# stale pid file whose pid was reused never makes us kill a stranger).
proc_in_dir() {
    local pid=$1 path=$2
    proc_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$path/"
}

wait_gone() { # wait_gone PID SECONDS
    local pid=$1 deadline=$(($(date +%s) + $2))
    while proc_alive "$pid"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# kill_session SID: SIGKILL what is left of the session of a server started
# with setsid (SID = its pid): Galera's state-transfer helpers (the
# wsrep_sst_mariabackup script, socat, mariabackup, under "timeout", which
# makes a process group of its own), and wait until they are gone.
kill_session() {
    local sid=$1 deadline=$(($(date +%s) + 10)) pid live
    while :; do
        live=0
        for pid in $(pgrep -s "$sid" 2>/dev/null || true); do
            if proc_alive "$pid"; then
                live=1
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done
        [ "$live" -eq 1 ] || return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            msg "WARNING: processes of session $sid do not die"
            return 0
        fi
        sleep 0.1
    done
}

# ---------------------------------------------------------------------------
# Ports (as in test-servers.sh)

port_in_use() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
    fi
}

# pick_port [EXCLUDED_PORT...]: a random free TCP port in PORT_MIN..PORT_MAX.
pick_port() {
    local port attempt excluded
    for attempt in $(seq 1 200); do
        port=$((PORT_MIN + (RANDOM * 32768 + RANDOM) % (PORT_MAX - PORT_MIN + 1)))
        for excluded in "$@"; do
            [ "$port" != "$excluded" ] || continue 2
        done
        if ! port_in_use "$port"; then
            echo "$port"
            return 0
        fi
    done
    die "could not find a free TCP port in $PORT_MIN-$PORT_MAX"
}

# ---------------------------------------------------------------------------
# Topology directories. DIR/$MARKER marks it as ours, DIR/topology says which
# kind (galera, pgpair, pgbouncer) it holds, DIR/env.sh has the exports.

TOPO_DIR=
TOPO_CREATED=0

validate_dir() { # validate_dir DIR MAXLEN
    case "$1" in
        /*) ;;
        *) die "directory path must be absolute: $1" ;;
    esac
    case "$1" in
        # The path ends up in URLs, configs and command lines unescaped.
        *[!A-Za-z0-9_./-]*) die "directory path must only contain [A-Za-z0-9_./-]: $1" ;;
    esac
    # Unix socket paths are limited to 107 bytes.
    [ "${#1}" -le "$2" ] || die "directory path too long for unix sockets (max $2 chars): $1"
}

# new_dir DIR KIND MAXLEN: create (or take over the empty) DIR for a new
# topology and arm the clean-up: a failed or interrupted start stops what it
# started and removes DIR (or, if DIR existed, empties it).
new_dir() {
    TOPO_DIR=$(realpath -m -- "$1")
    validate_dir "$TOPO_DIR" "$3"
    if [ -e "$TOPO_DIR" ]; then
        [ -d "$TOPO_DIR" ] || die "$TOPO_DIR exists and is not a directory"
        [ -z "$(ls -A "$TOPO_DIR")" ] || die "$TOPO_DIR is not empty"
    else
        mkdir -p "$TOPO_DIR"
        TOPO_CREATED=1
    fi
    trap 'trap "" INT TERM; start_failed' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    touch "$TOPO_DIR/$MARKER"
    echo "$2" >"$TOPO_DIR/topology"
    # PostgreSQL and PgBouncer run as postgres and must reach their files.
    chmod 755 "$TOPO_DIR"
    if is_root && [ "$2" != galera ] && ! runuser -u postgres -- test -x "$TOPO_DIR"; then
        die "user postgres cannot access $TOPO_DIR (a parent directory is not world-searchable?)"
    fi
}

start_failed() {
    msg "start failed; stopping what was started in $TOPO_DIR"
    stop_processes "$TOPO_DIR"
    if [ "$TOPO_CREATED" -eq 1 ]; then
        rm -rf -- "$TOPO_DIR"
    else
        find "$TOPO_DIR" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
    fi
}

start_done() { trap - EXIT INT TERM; }

# check_dir DIR KIND: the DIR argument of the *-node commands (canonical).
check_dir() {
    local dir=$1 kind=$2 found
    [ -n "$dir" ] || usage
    [ -d "$dir" ] || die "$dir does not exist"
    [ -e "$dir/$MARKER" ] || die "$dir was not created by topologies.sh (no $MARKER)"
    found=$(cat "$dir/topology" 2>/dev/null || true)
    [ "$found" = "$kind" ] || die "$dir holds a '$found' topology, not $kind"
}

# write_exports DIR NAME VALUE...: DIR/env.sh, then the same lines on stdout.
# Single quotes (' escaped as '\'') keep them valid for both eval and source.
write_exports() {
    local dir=$1 name value
    shift
    : >"$dir/env.sh"
    while [ "$#" -gt 0 ]; do
        name=$1 value=$2
        shift 2
        printf "export %s='%s'\n" "$name" "${value//\'/\'\\\'\'}" >>"$dir/env.sh"
    done
    cat "$dir/env.sh"
}

show_log() { # the end of a log, to explain why a server did not come up
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
# MariaDB Galera. Layout of DIR:
#   DIR/ports                   one line per node: N mysql_port gcomm_port ist_port sst_port
#   DIR/nN/my.cnf               node N's whole configuration (also read by the SST scripts)
#   DIR/nN/data, DIR/nN/mariadbd.{pid,err,out}, DIR/nN/launch.pid, DIR/nN/recover.log
#   DIR/nN.sock                 node N's unix socket

GALERA_NODES="1 2 3"

gal_node() { echo "$1/n$2"; }
gal_cnf() { echo "$1/n$2/my.cnf"; }
gal_sock() { echo "$1/n$2.sock"; }
gal_err() { echo "$1/n$2/mariadbd.err"; }

gal_port() { # gal_port DIR N mysql|gcomm|ist|sst
    local col
    case "$3" in
        mysql) col=2 ;;
        gcomm) col=3 ;;
        ist) col=4 ;;
        sst) col=5 ;;
    esac
    awk -v n="$2" -v c="$col" '$1 == n { print $c }' "$1/ports"
}

gal_pick_ports() {
    local dir=$1 n port line picked=()
    : >"$dir/ports"
    for n in $GALERA_NODES; do
        line=$n
        for _ in mysql gcomm ist sst; do
            port=$(pick_port ${picked[@]+"${picked[@]}"})
            picked+=("$port")
            line+=" $port"
        done
        echo "$line" >>"$dir/ports"
    done
}

gal_write_cnf() { # gal_write_cnf DIR N
    local dir=$1 n=$2 m peers="" user=""
    for m in $GALERA_NODES; do
        peers+="${peers:+,}127.0.0.1:$(gal_port "$dir" "$m" gcomm)"
    done
    # Like test-servers.sh's MariaDB: as root, mariadbd runs as root (it refuses
    # to unless told so); otherwise as the invoking user.
    if is_root; then user="user = root"; fi
    mkdir -p "$(gal_node "$dir" "$n")"
    cat >"$(gal_cnf "$dir" "$n")" <<EOF
# dblock test topology (scripts/topologies.sh): Galera node $n
[mysqld]
$user
datadir = $(gal_node "$dir" "$n")/data
socket = $(gal_sock "$dir" "$n")
port = $(gal_port "$dir" "$n" mysql)
bind-address = 127.0.0.1
pid-file = $(gal_node "$dir" "$n")/mariadbd.pid
log-error = $(gal_err "$dir" "$n")
skip-name-resolve
max-connections = 300
innodb_buffer_pool_size = 64M
# Small redo log: less to copy to the joiners and to delete on stop.
innodb_log_file_size = 16M
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = $GALERA_LIB
wsrep_cluster_name = dblock_test
wsrep_cluster_address = gcomm://$peers
wsrep_node_name = node$n
wsrep_node_address = 127.0.0.1:$(gal_port "$dir" "$n" gcomm)
wsrep_node_incoming_address = 127.0.0.1:$(gal_port "$dir" "$n" mysql)
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:$(gal_port "$dir" "$n" gcomm);ist.recv_addr=127.0.0.1:$(gal_port "$dir" "$n" ist);gcache.size=64M;$GALERA_EVS"
wsrep_sst_receive_address = 127.0.0.1:$(gal_port "$dir" "$n" sst)
# rsync SST fails here (its daemon cannot write the joiner's datadir); mariabackup works.
wsrep_sst_method = mariabackup
wsrep_sst_auth = root:
EOF
}

gal_pid() { # gal_pid DIR N: the running mariadbd of node N, if any
    local node pid f
    node=$(gal_node "$1" "$2")
    for f in "$node/mariadbd.pid" "$node/launch.pid"; do
        [ -s "$f" ] || continue
        pid=$(cat "$f")
        if proc_in_dir "$pid" "$node"; then
            echo "$pid"
            return 0
        fi
    done
    return 1
}

gal_running_nodes() { # the numbers of the nodes whose mariadbd runs
    local n
    for n in $GALERA_NODES; do
        if gal_pid "$1" "$n" >/dev/null; then echo "$n"; fi
    done
}

gal_sql() { # gal_sql DIR N [ARGS]: as root over node N's unix socket
    local dir=$1 n=$2
    shift 2
    "$MARIADB" --no-defaults --socket="$(gal_sock "$dir" "$n")" -uroot --batch \
        --skip-column-names --connect-timeout=2 "$@"
}

# gal_state DIR N: "SIZE STATUS STATE", e.g. "3 Primary Synced"; fails if the
# node does not answer.
gal_state() {
    gal_sql "$1" "$2" -e "SHOW GLOBAL STATUS WHERE Variable_name IN
        ('wsrep_cluster_size', 'wsrep_cluster_status', 'wsrep_local_state_comment')" 2>/dev/null |
        awk -F '\t' '{ v[$1] = $2 } END {
            if (!("wsrep_cluster_size" in v)) exit 1
            print v["wsrep_cluster_size"], v["wsrep_cluster_status"], v["wsrep_local_state_comment"] }'
}

# gal_launch DIR N [MARIADBD_ARGS...]: start node N's mariadbd in the
# background. setsid: its own session and process group, so a Ctrl-C does not
# hit it behind our back and its state-transfer helpers can be killed with it.
# No inherited stdout, so $(topologies.sh galera-start) does not wait for it.
gal_launch() {
    local dir=$1 n=$2 node env=()
    shift 2
    node=$(gal_node "$dir" "$n")
    rm -f "$node/mariadbd.pid"
    # GAL_CLOCK_OFFSET (galera-node start N OFFSET): a node whose wall clock is off.
    if [ -n "${GAL_CLOCK_OFFSET:-}" ]; then
        env=(env "FAKETIME=$GAL_CLOCK_OFFSET" DONT_FAKE_MONOTONIC=1 "LD_PRELOAD=$FAKETIME_LIB")
    fi
    setsid ${env[@]+"${env[@]}"} "$MARIADBD" --defaults-file="$(gal_cnf "$dir" "$n")" "$@" \
        </dev/null >>"$node/mariadbd.out" 2>&1 &
    echo "$!" >"$node/launch.pid"
    disown "$!" # no "Killed" notice from bash when a test kills it
}

gal_not_ready_logs() { # show the log of every running node not in STATE "$2"
    local dir=$1 want=$2 n
    for n in $(gal_running_nodes "$dir"); do
        if [ "$(gal_state "$dir" "$n" || true)" != "$want" ]; then show_log "$(gal_err "$dir" "$n")"; fi
    done
}

# gal_wait DIR K TIMEOUT [N]: until every running node is Synced in a primary
# component of size K. With N: fail at once if node N's mariadbd exits.
gal_wait() {
    local dir=$1 k=$2 timeout=$3 watch=${4:-} deadline n running ok status
    deadline=$(($(date +%s) + timeout))
    while :; do
        running=$(gal_running_nodes "$dir")
        # The watched node must itself answer: the others may still count it.
        if [ -n "$watch" ] && ! grep -qx "$watch" <<<"$running"; then
            show_log "$(gal_err "$dir" "$watch")"
            msg "node $watch (mariadbd) exited"
            return 1
        fi
        ok=1
        [ -n "$running" ] || ok=0
        for n in $running; do
            [ "$(gal_state "$dir" "$n" || true)" = "$k Primary Synced" ] || ok=0
        done
        [ "$ok" -eq 0 ] || return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            gal_not_ready_logs "$dir" "$k Primary Synced"
            status=$(gal_status "$dir")
            printf '%s\n' "$status" >&2
            if grep -q non-Primary <<<"$status"; then
                msg "no primary component (quorum lost?): kill the running nodes and start" \
                    "them again; the first one started bootstraps the cluster"
            fi
            msg "the running nodes did not reach cluster size $k, all Synced, within ${timeout}s"
            return 1
        fi
        sleep 0.2
    done
}

# gal_stop_pid PID SIG: stop a node's mariadbd, wait until it is gone, kill
# what is left of its session.
gal_stop_pid() {
    local pid=$1 sig=$2
    kill "-$sig" "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$GALERA_STOP_TIMEOUT"; then
        msg "mariadbd $pid ignored SIG$sig for ${GALERA_STOP_TIMEOUT}s; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || msg "WARNING: mariadbd $pid does not die"
    fi
    kill_session "$pid"
}

gal_stop_node() { # gal_stop_node DIR N TERM|KILL
    local pid
    pid=$(gal_pid "$1" "$2") || return 0
    gal_stop_pid "$pid" "$3"
}

# All nodes at once, with SIGKILL: nothing in DIR survives the stop, and a
# clean shutdown of the whole cluster sometimes takes several seconds.
gal_stop_all() {
    local dir=$1 n pid t0 pids=()
    t0=$(now_ms)
    for n in $GALERA_NODES; do
        if pid=$(gal_pid "$dir" "$n"); then pids+=("$pid"); fi
    done
    for pid in ${pids[@]+"${pids[@]}"}; do kill -KILL "$pid" 2>/dev/null || true; done
    for pid in ${pids[@]+"${pids[@]}"}; do gal_stop_pid "$pid" KILL; done
    msg "Galera nodes of $dir stopped ($(elapsed "$t0"))"
}

# The position (uuid:seqno) of node N's data after a crash, found like
# mysqld_safe does with --wsrep-recover: then grastate.dat says seqno -1 and
# only InnoDB knows it. Without it the node would need a full state transfer
# (SST, 10 s of built-in sleep in wsrep_sst_mariabackup alone) instead of an
# incremental one (IST) from a donor's gcache. Empty if unknown, or if
# grastate.dat has it (after a clean shutdown; Galera reads it there).
gal_recover_position() {
    local dir=$1 n=$2 log seqno
    seqno=$(sed -n 's/^seqno: *//p' "$(gal_node "$dir" "$n")/data/grastate.dat" 2>/dev/null || true)
    if [ -n "$seqno" ] && [ "$seqno" != -1 ]; then return 0; fi
    log="$(gal_node "$dir" "$n")/recover.log"
    rm -f "$log"
    "$MARIADBD" --defaults-file="$(gal_cnf "$dir" "$n")" --wsrep-recover --log-error="$log" \
        </dev/null >/dev/null 2>&1 || true
    sed -n 's/.*WSREP: Recovered position: *//p' "$log" 2>/dev/null | tail -n 1 |
        grep -E '^[0-9a-f-]{36}:[0-9]+$' | grep -v '^00000000-0000-0000-0000-000000000000:' || true
}

# gal_clear_session DIR N: a node whose mariadbd exited by itself (a join that
# failed, e.g. its IST port was taken) can leave its state-transfer helpers
# running in its session (wsrep_sst_mariabackup and socat wait up to 300 s for
# a donor); the next start's transfer then fails at once ("previous SST script
# still running"). Killed only when one of them names the node's directory, so
# that a session id reused by a stranger is left alone.
gal_clear_session() {
    local node sid pid
    node=$(gal_node "$1" "$2")
    [ -s "$node/launch.pid" ] || return 0
    sid=$(cat "$node/launch.pid")
    for pid in $(pgrep -s "$sid" 2>/dev/null || true); do
        if proc_in_dir "$pid" "$node"; then
            msg "node $2: killing what is left of its last run (session $sid)"
            kill_session "$sid"
            return 0
        fi
    done
}

# gal_start_node DIR N: start node N (if it is not running) and wait until it
# and every other running node are Synced. With no other node running it
# bootstraps a new primary component from its own data. A node started again
# while the others still count its killed self as a member takes 10-15 s to
# get in (install timeouts, repeated view changes): first wait until they
# have dropped it (evs.suspect_timeout after the kill).
gal_start_node() {
    local dir=$1 n=$2 t0 pos="" k grastate args=()
    t0=$(now_ms)
    if gal_pid "$dir" "$n" >/dev/null; then
        msg "node $n is already running"
    else
        k=$(gal_running_nodes "$dir" | wc -l)
        if [ "$k" -gt 0 ]; then
            gal_wait "$dir" "$k" 30 || return 1
        fi
        gal_clear_session "$dir" "$n"
        pos=$(gal_recover_position "$dir" "$n")
        if [ -n "$pos" ]; then args+=(--wsrep-start-position="$pos"); fi
        if [ "$k" -eq 0 ]; then
            msg "no other node runs: node $n bootstraps the cluster again"
            grastate="$(gal_node "$dir" "$n")/data/grastate.dat"
            if [ -f "$grastate" ]; then
                sed -i 's/^safe_to_bootstrap: .*/safe_to_bootstrap: 1/' "$grastate"
            fi
            args+=(--wsrep-new-cluster)
        fi
        gal_launch "$dir" "$n" ${args[@]+"${args[@]}"}
    fi
    k=$(gal_running_nodes "$dir" | wc -l)
    gal_wait "$dir" "$k" "$GALERA_SYNC_TIMEOUT" "$n" || return 1
    msg "node $n Synced on 127.0.0.1:$(gal_port "$dir" "$n" mysql)," \
        "cluster size $k ($(elapsed "$t0")${pos:+, from $pos})"
}

gal_install_db() { # node 1's system tables
    local dir=$1 args
    args=(--no-defaults --datadir="$(gal_node "$dir" 1)/data"
        --auth-root-authentication-method=normal --skip-test-db --innodb-log-file-size=16M)
    if is_root; then args+=(--user=root); fi
    if ! "$MARIADB_INSTALL_DB" "${args[@]}" >"$(gal_node "$dir" 1)/install-db.log" 2>&1; then
        show_log "$(gal_node "$dir" 1)/install-db.log"
        die "mariadb-install-db failed"
    fi
}

# Node 1 bootstraps the cluster once and shuts down cleanly; nodes 2 and 3
# start from copies of that data, so that they join with an IST (about 2 s
# each) instead of an SST (about 15 s each). Only a clean shutdown of a Galera
# node stores the cluster position in InnoDB, which a joiner checks after the
# transfer; a copy of plain mariadb-install-db data is refused.
gal_bootstrap() {
    local dir=$1 n data t0
    t0=$(now_ms)
    gal_install_db "$dir"
    gal_launch "$dir" 1 --wsrep-new-cluster
    gal_wait "$dir" 1 "$GALERA_SYNC_TIMEOUT" 1 || die "node 1 did not bootstrap"
    gal_stop_node "$dir" 1 TERM
    for n in 2 3; do
        data="$(gal_node "$dir" "$n")/data"
        cp -a --reflink=auto "$(gal_node "$dir" 1)/data" "$data"
        rm -f "$data/gvwstate.dat" "$data/galera.cache"
        sed -i 's/^safe_to_bootstrap: .*/safe_to_bootstrap: 0/' "$data/grastate.dat"
    done
    gal_launch "$dir" 1 --wsrep-new-cluster
    gal_wait "$dir" 1 "$GALERA_SYNC_TIMEOUT" 1 || die "node 1 did not bootstrap again"
    msg "node 1 bootstrapped the cluster on 127.0.0.1:$(gal_port "$dir" 1 mysql) ($(elapsed "$t0"))"
}

# Created once on node 1; DDL replicates to the others in total order. The
# grants are test-servers.sh's (PROCESS and CONNECTION ADMIN let the tests see
# and KILL other sessions).
gal_create_users() {
    local dir=$1 n deadline hosts="'$DB_USER'@'%', '$DB_USER'@'127.0.0.1', '$DB_USER'@'localhost'"
    gal_sql "$dir" 1 <<EOF
CREATE DATABASE $DB_NAME DEFAULT CHARACTER SET utf8mb4;
CREATE USER '$DB_USER'@'%' IDENTIFIED BY '$DB_PASSWORD';
CREATE USER '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASSWORD';
CREATE USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASSWORD';
GRANT ALL ON $DB_NAME.* TO $hosts;
GRANT PROCESS, CONNECTION ADMIN ON *.* TO $hosts;
EOF
    # Check that it arrived everywhere: log in over TCP on every node.
    for n in $GALERA_NODES; do
        deadline=$(($(date +%s) + 10))
        until MYSQL_PWD=$DB_PASSWORD "$MARIADB" --no-defaults -h 127.0.0.1 \
            -P "$(gal_port "$dir" "$n" mysql)" -u "$DB_USER" --connect-timeout=2 \
            -e 'SELECT 1' "$DB_NAME" >/dev/null 2>&1; do
            [ "$(date +%s)" -lt "$deadline" ] || die "user $DB_USER cannot log in on node $n"
            sleep 0.1
        done
    done
}

gal_exports() {
    local dir=$1 n hosts="" vars=()
    for n in $GALERA_NODES; do
        hosts+="${hosts:+,}127.0.0.1:$(gal_port "$dir" "$n" mysql)"
        vars+=("DBLOCK_TEST_GALERA_NODE${n}_URL"
            "mysql://$DB_USER:$DB_PASSWORD@127.0.0.1:$(gal_port "$dir" "$n" mysql)/$DB_NAME")
    done
    for n in $GALERA_NODES; do
        vars+=("DBLOCK_TEST_GALERA_ADMIN_URL_$n"
            "mysql://root@localhost/$DB_NAME?unix_socket=$(gal_sock "$dir" "$n")")
    done
    write_exports "$dir" \
        DBLOCK_TEST_GALERA_DIR "$dir" \
        DBLOCK_TEST_GALERA_URL "mysql://$DB_USER:$DB_PASSWORD@$hosts/$DB_NAME" \
        "${vars[@]}" \
        DBLOCK_TEST_GALERA_CMD "$(printf '%q galera-node %q' "$SCRIPT" "$dir")"
}

cmd_galera_start() {
    local n t0
    [ "$#" -eq 1 ] || usage
    t0=$(now_ms)
    [ -r "$GALERA_LIB" ] ||
        die "Galera provider $GALERA_LIB not found (package galera-4; run scripts/install-deps.sh)"
    find_tool wsrep_sst_mariabackup >/dev/null
    find_tool socat >/dev/null
    new_dir "$1" galera 99
    gal_pick_ports "$TOPO_DIR"
    for n in $GALERA_NODES; do gal_write_cnf "$TOPO_DIR" "$n"; done
    gal_bootstrap "$TOPO_DIR"
    for n in 2 3; do
        gal_start_node "$TOPO_DIR" "$n" || die "node $n did not join the cluster"
    done
    gal_create_users "$TOPO_DIR"
    gal_exports "$TOPO_DIR"
    start_done
    msg "Galera cluster of 3 Synced nodes ready in $(elapsed "$t0"), directory $TOPO_DIR"
}

gal_status() {
    local dir=$1 n state size status local_state
    for n in $GALERA_NODES; do
        if ! gal_pid "$dir" "$n" >/dev/null; then
            echo "node$n down 127.0.0.1:$(gal_port "$dir" "$n" mysql)"
        elif state=$(gal_state "$dir" "$n"); then
            read -r size status local_state <<<"$state"
            echo "node$n up 127.0.0.1:$(gal_port "$dir" "$n" mysql) size=$size status=$status state=$local_state"
        else
            echo "node$n up 127.0.0.1:$(gal_port "$dir" "$n" mysql) (not answering yet)"
        fi
    done
}

cmd_galera_node() {
    local dir action=${2:-} arg=${3:-} offset=${4:-} pid t0
    [ -n "${1:-}" ] || usage
    dir=$(realpath -m -- "$1")
    check_dir "$dir" galera
    case "$action" in
        kill | start) [[ "$arg" =~ ^[1-3]$ ]] || die "node number must be 1, 2 or 3, not '$arg'" ;;
        wait-size) [[ "$arg" =~ ^[1-3]$ ]] || die "cluster size must be 1, 2 or 3, not '$arg'" ;;
        status) ;;
        *) usage ;;
    esac
    t0=$(now_ms)
    case "$action" in
        kill)
            pid=$(gal_pid "$dir" "$arg") || die "node $arg is not running"
            gal_stop_pid "$pid" KILL
            msg "node $arg killed (mariadbd $pid, $(elapsed "$t0"))"
            ;;
        start)
            if [ -n "$offset" ]; then
                [[ "$offset" =~ ^[+-][0-9]+(\.[0-9]+)?$ ]] ||
                    die "clock offset must be +SECONDS or -SECONDS, not '$offset'"
                [ -r "$FAKETIME_LIB" ] || die "$FAKETIME_LIB not found (package faketime)"
                GAL_CLOCK_OFFSET=$offset
                msg "node $arg starts with its clock ${offset}s off"
            fi
            gal_start_node "$dir" "$arg" || die "node $arg did not rejoin"
            ;;
        wait-size)
            gal_wait "$dir" "$arg" "$GALERA_SYNC_TIMEOUT" || die "cluster size $arg not reached"
            msg "running nodes Synced, cluster size $arg ($(elapsed "$t0"))"
            ;;
        status) gal_status "$dir" ;;
    esac
}

# ---------------------------------------------------------------------------
# PostgreSQL primary + standby. Layout of DIR:
#   DIR/pg1, DIR/pg2            data/, postgres.log, port (owned by postgres);
#                               pg1 starts as the primary, pg2 as its standby
#   DIR/sock/                   both servers' unix sockets
#   DIR/mode                    sync or async

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

pp_kill_primary() {
    local dir=$1 n t0
    t0=$(now_ms)
    n=$(pp_find "$dir" primary) || die "no running primary in $dir"
    pp_stop_server "$dir" "$n" immediate
    msg "primary pg$n (127.0.0.1:$(pp_port "$dir" "$n")) stopped with -m immediate ($(elapsed "$t0"))"
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

pp_stop_standby() {
    local dir=$1 n t0
    t0=$(now_ms)
    n=$(pp_find "$dir" standby) || die "no running standby in $dir"
    pp_stop_server "$dir" "$n" immediate
    msg "standby pg$n (127.0.0.1:$(pp_port "$dir" "$n")) stopped with -m immediate ($(elapsed "$t0"))"
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
            pp_kill_primary "$dir"
            pp_promote "$dir"
            msg "failover done in $(elapsed "$t0")"
            ;;
        kill-primary) pp_kill_primary "$dir" ;;
        promote) pp_promote "$dir" ;;
        stop-standby) pp_stop_standby "$dir" ;;
        desync) pp_desync "$dir" ;;
        status) pp_status "$dir" ;;
        *) usage ;;
    esac
}

# ---------------------------------------------------------------------------
# PgBouncer. Layout of DIR:
#   DIR/run/                    pgbouncer.ini, userlist.txt, pgbouncer.{pid,log}
#                               (owned by postgres)
#   DIR/port                    its port on 127.0.0.1

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
        -p "$(pb_port "$1")" -U "$DB_USER" -d "$DB_NAME" -c 'SELECT 1' 2>/dev/null | grep -qx 1
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
            tail -c "+$((offset + 1))" "$run/pgbouncer.log" 2>/dev/null | grep -q ' FATAL '; then
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

# ---------------------------------------------------------------------------
# Stopping

# Kill processes of DIR that the pid files do not know about (e.g. a server
# launched just as a start was interrupted): those whose command line names
# the directory, of these names only.
sweep_leftovers() {
    local dir=$1 pid comm leftovers=()
    for pid in $(pgrep -f -- "$dir/" 2>/dev/null || true); do
        comm=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
        case "$comm" in
            mariadbd | mysqld | mariadb-install* | mysql_install_d* | wsrep_sst_* | mariabackup | \
                mariadb-backup | postgres | postmaster | pg_ctl | initdb | pg_basebackup | pgbouncer)
                if proc_alive "$pid"; then leftovers+=("$pid"); fi
                ;;
        esac
    done
    [ "${#leftovers[@]}" -gt 0 ] || return 0
    msg "WARNING: killing leftover processes: ${leftovers[*]}"
    kill -KILL "${leftovers[@]}" 2>/dev/null || true
    for pid in "${leftovers[@]}"; do wait_gone "$pid" 5 || true; done
}

stop_processes() { # stop whatever runs in DIR; leaves DIR in place
    local dir=$1
    case "$(cat "$dir/topology" 2>/dev/null || true)" in
        galera) gal_stop_all "$dir" ;;
        pgpair) pp_stop_all "$dir" ;;
        pgbouncer) pb_stop "$dir" TERM ;;
    esac
    sweep_leftovers "$dir"
}

cmd_stop() {
    local dir kind t0
    [ "$#" -eq 1 ] || usage
    dir=$(realpath -m -- "$1")
    if [ ! -e "$dir" ]; then
        msg "$dir does not exist; nothing to stop"
        return 0
    fi
    [ -e "$dir/$MARKER" ] || die "$dir was not created by topologies.sh (no $MARKER); not touching it"
    t0=$(now_ms)
    kind=$(cat "$dir/topology" 2>/dev/null || true)
    # Stopping must not be cut short half-way by a second Ctrl-C.
    trap '' INT TERM
    stop_processes "$dir"
    rm -rf -- "$dir"
    msg "${kind:-topology} stopped, $dir removed ($(elapsed "$t0"))"
}

main() {
    local cmd=${1:-}
    [ -n "$cmd" ] || usage
    shift
    case "$cmd" in
        galera-*)
            MARIADBD=$(find_tool mariadbd)
            MARIADB=$(find_tool mariadb)
            MARIADB_INSTALL_DB=$(find_tool mariadb-install-db)
            ;;
    esac
    case "$cmd" in
        galera-start) cmd_galera_start "$@" ;;
        galera-node) cmd_galera_node "$@" ;;
        pgpair-start) cmd_pgpair_start "$@" ;;
        pgpair-node) cmd_pgpair_node "$@" ;;
        pgbouncer-start) cmd_pgbouncer_start "$@" ;;
        pgbouncer-node) cmd_pgbouncer_node "$@" ;;
        stop) cmd_stop "$@" ;;
        -h | --help | help) usage ;;
        *)
            msg "unknown command: $cmd"
            usage
            ;;
    esac
}

main "$@"
