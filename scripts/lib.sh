# shellcheck shell=bash
# Shell helpers shared by scripts/test-servers.sh and the topology scripts
# (scripts/topology/common.sh), which source this file after defining msg()
# (their own prefix), SCRIPT (for usage), PORT_MIN and PORT_MAX.

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

# PostgreSQL refuses to run as root, so as root its tools run as the
# "postgres" system user. As a normal user they just run as that user.
# cd / first: initdb and pg_ctl fail if they cannot read the current
# directory (e.g. /root), and every path we pass is absolute anyway.
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

# True if PID exists and is not a zombie. A zombie still answers kill -0, and
# server processes whose parent exited are re-parented to PID 1, which in
# containers/VMs does not always reap them; counting zombies as alive would
# make every stop wait for its full timeout.
proc_alive() {
    local pid=$1 stat
    [ -n "$pid" ] || return 1
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    stat=${stat##*) } # strip "pid (comm) ", comm may contain spaces
    [ "${stat%% *}" != Z ]
}

# True if PID is alive and its command line mentions DIR. Guards against
# killing an unrelated process that reused a pid from a stale pid file.
proc_in_dir() {
    local pid=$1 dir=$2
    proc_alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -F -- "$dir/" >/dev/null
}

wait_gone() { # wait_gone PID SECONDS
    local pid=$1 deadline=$(($(date +%s) + $2))
    while proc_alive "$pid"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

port_in_use() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ]
    else
        # Without ss: a successful connect means somebody listens there.
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
    fi
}

# pick_port [EXCLUDED_PORT...]: a random free TCP port in PORT_MIN..PORT_MAX.
# Still racy (someone may grab it before the server binds), which is why
# the server start also retries with a new port on "Address already in use".
pick_port() {
    local port excluded
    for _ in $(seq 1 200); do
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
