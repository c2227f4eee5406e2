# shellcheck shell=bash
# The 3-node MariaDB Galera cluster of scripts/topologies.sh (galera-start, galera-node),
# sourced by it after scripts/topology/common.sh. Layout of DIR:
#   DIR/ports                   one line per node: N mysql_port gcomm_port ist_port sst_port
#   DIR/nN/my.cnf               node N's whole configuration (also read by the SST scripts)
#   DIR/nN/data, DIR/nN/mariadbd.{pid,err,out}, DIR/nN/launch.pid, DIR/nN/recover.log
#   DIR/nN.sock                 node N's unix socket

GALERA_LIB=${DBLOCK_TEST_GALERA_LIB:-/usr/lib/galera/libgalera_smm.so}
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1

GALERA_SYNC_TIMEOUT=120 # a full state transfer (SST) alone takes over 10 s
GALERA_STOP_TIMEOUT=60  # seconds after SIGTERM before SIGKILL

# Galera's group communication, tuned for tests on loopback. A killed node is
# suspected after 3 s and dropped from the view (the defaults take 5-15 s).
# The rules: suspect_timeout < inactive_timeout <= install_timeout, and
# keepalive_period well below suspect_timeout. join_retrans_period 0.2 s
# (default 1 s) lets a joining node into the view within a fraction of a
# second instead of about 3 s. pc.weight stays at its default (1 per node),
# so any two of the three nodes are a majority.
GALERA_EVS="evs.keepalive_period=PT1S;evs.suspect_timeout=PT3S"
GALERA_EVS+=";evs.inactive_timeout=PT6S;evs.install_timeout=PT6S;evs.join_retrans_period=PT0.2S"

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

gal_find_tools() { # the MariaDB programs every galera-* command needs
    MARIADBD=$(find_tool mariadbd)
    MARIADB=$(find_tool mariadb)
    MARIADB_INSTALL_DB=$(find_tool mariadb-install-db)
}
