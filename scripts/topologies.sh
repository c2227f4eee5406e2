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
# This file is the command line only. The code is in scripts/topology/: common.sh
# (what every topology shares: messages, the DIR marker, free ports, process
# waits, the exports, "stop DIR") and one file per topology, galera.sh,
# pgpair.sh and pgbouncer.sh, each sourced when a command needs it.
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
# shellcheck source=scripts/topology/common.sh
. "$(dirname "$SCRIPT")/topology/common.sh"

main() {
    local cmd=${1:-}
    [ -n "$cmd" ] || usage
    shift
    case "$cmd" in
        galera-*)
            load_topology galera
            gal_find_tools
            ;;
        pgpair-*) load_topology pgpair ;;
        pgbouncer-*) load_topology pgbouncer ;;
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
