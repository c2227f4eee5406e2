# shellcheck shell=bash
# The helpers shared by the test topologies, sourced by scripts/topologies.sh (the command
# line; SCRIPT names it) before the file of one topology: scripts/topology/galera.sh,
# pgpair.sh or pgbouncer.sh. Messages, the DIR marker, free ports, the process waits, the
# exports and "stop DIR" for any topology are here; nothing here starts a server.

# shellcheck disable=SC2034 # the settings below are used by the topology files
TOPOLOGY_LIB=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
PG_BIN=${DBLOCK_TEST_PG_BIN:-/usr/lib/postgresql/15/bin}

# Fixed test credentials, the same as test-servers.sh's.
DB_NAME=dblock_test
DB_USER=dblock
DB_PASSWORD=dblock-secret

# Marker file: "stop" refuses to rm -rf a directory that does not have it.
MARKER=.dblock-topology

PORT_MIN=20000
PORT_MAX=60000

TOPOLOGIES_LOADED= # the kinds load_topology has sourced

msg() { printf 'topologies: %s\n' "$*" >&2; }
# shellcheck source=scripts/lib.sh
. "$(dirname "$SCRIPT")/lib.sh" # (SCRIPT is scripts/topologies.sh)

# ---------------------------------------------------------------------------
# Processes

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
# Topology files

# load_topology KIND: the functions of topology KIND (galera, pgpair, pgbouncer), from
# scripts/topology/KIND.sh, once.
load_topology() {
    case "$1" in
        galera | pgpair | pgbouncer) ;;
        *) die "unknown topology '$1'" ;;
    esac
    case " $TOPOLOGIES_LOADED " in
        *" $1 "*) ;;
        *)
            # shellcheck source=/dev/null
            . "$TOPOLOGY_LIB/$1.sh"
            TOPOLOGIES_LOADED+=" $1"
            ;;
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
        galera) load_topology galera; gal_stop_all "$dir" ;;
        pgpair) load_topology pgpair; pp_stop_all "$dir" ;;
        pgbouncer) load_topology pgbouncer; pb_stop "$dir" TERM ;;
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
