#!/usr/bin/python3
"""A worker of the fault suite's fenced counter that speaks only the SQL API (docs/sql-api.md).

Started by the C++ worker "sql_counter_worker" (fault_support.cpp), which execs it with the same
key=value arguments as the library's counter worker, and writes the same log lines to
<dir>/w<id>.log (see fault_support.hpp), so the parent's analysis counts its grants and writes
with the library's: a Python client on psycopg2 (PostgreSQL) or MySQLdb (MySQL/MariaDB) and C++
workers contend for one lease through one lock table.

The loop: dblock_acquire(name, owner, ttl) (a try: NULL when held) -> work -> one transaction
{ dblock_check_fence(name, fence); read the counter n; write n+1; log (n+1, fence, owner) } ->
dblock_release(name, owner, fence). A new owner token per acquire. Outcomes:
  DL001 from check_fence                 -> "L" (the lease was lost: nothing written)
  an error before COMMIT was sent        -> "X" (rolled back)
  an error during COMMIT                 -> "D" (in doubt: resolved by reading the items log
                                            by owner token on a direct connection)
  "not acquired" while the row carries our token, unexpired -> "N" (a violation)
  with check_valid=1, 3/4 of the TTL gone since the acquire was sent -> "V" (not used)
"""
import os
import random
import struct
import sys
import time
import urllib.parse
import mmap

ARGS = dict(a.split("=", 1) for a in sys.argv[1:])
ID = int(ARGS["id"])
DIR = ARGS["dir"]
PREFIX = ARGS["prefix"]
LOCK = ARGS["lock"]
TTL = int(ARGS["ttl"])
WORK = int(ARGS["work"])
IN_TXN = int(ARGS["in_txn"])
IDLE = int(ARGS["idle"])
FENCED = ARGS["fenced"] == "1"
CHECK_VALID = ARGS["check_valid"] == "1"
if ARGS.get("kind", "lease") != "lease" or ARGS.get("own_lock", "0") == "1":
    sys.exit("sql_worker.py: only kind=lease and own_lock=0 are supported")
STOP = os.path.join(DIR, "stop")
PG = ARGS["url"].startswith("postgresql://")
COUNTER, ITEMS, LOCKS = PREFIX + "counter", PREFIX + "items", PREFIX + "resource_lock"

if PG:
    import psycopg2 as driver
else:
    import MySQLdb as driver

log_fd = os.open(os.path.join(DIR, "w%d.log" % ID), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def log(line):
    os.write(log_fd, (line + "\n").encode())


def mono_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


slots = None
if ARGS.get("slots"):
    with open(ARGS["slots"], "r+b") as f:
        slots = mmap.mmap(f.fileno(), 64 * 8)


def set_slot(v):
    if slots is not None:
        slots[ID * 8:ID * 8 + 8] = struct.pack("<q", v)


def connect(url):
    """A connection of `url` (autocommit), failing within seconds on a dead or silent server."""
    u = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(u.username or "")
    password = urllib.parse.unquote(u.password or "")
    db = urllib.parse.unquote(u.path.lstrip("/"))
    if PG:
        c = driver.connect(host=u.hostname, port=u.port or 5432, user=user, password=password,
                           dbname=db, connect_timeout=5, keepalives=1, keepalives_idle=2,
                           keepalives_interval=1, keepalives_count=3,
                           options="-c statement_timeout=10000")
        c.autocommit = True
    else:
        c = driver.connect(host=u.hostname, port=u.port or 3306, user=user, password=password,
                           database=db, connect_timeout=5, read_timeout=10, write_timeout=10)
        c.autocommit(True)
    return c


def one(conn, sql, args):
    """Runs `sql` (a SELECT of a function, or a CALL of a procedure) and returns its one value."""
    cur = conn.cursor()
    try:
        cur.execute(sql, args)
        row = cur.fetchone() if cur.description else None
        if not PG:
            while cur.nextset():  # the status after a procedure's row
                pass
        return row[0] if row else None
    finally:
        cur.close()


def call(routine, nargs):
    ph = ", ".join(["%s"] * nargs)
    return ("SELECT %s%s(%s)" if PG else "CALL %s%s(%s)") % (PREFIX, routine, ph)


ACQUIRE, CHECK, RELEASE = call("dblock_acquire", 3), call("dblock_check_fence", 2), \
    call("dblock_release", 3)


def sqlstate(e):
    if PG:
        return getattr(e, "pgcode", None) or ""
    # MySQLdb: (errno, message); a SIGNAL of SQLSTATE 'DL001' is errno 1644 with our message.
    if e.args and e.args[0] == 1644 and len(e.args) > 1 and "is not the current grant" in str(
            e.args[1]):
        return "DL001"
    return ""


def row_of(conn):
    """(owner_token, fence, unexpired, holds) of the lease row, or None."""
    now = "clock_timestamp()" if PG else "UTC_TIMESTAMP(6)"
    cur = conn.cursor()
    try:
        cur.execute("SELECT owner_token, fence, CASE WHEN expires_at > %s THEN 1 ELSE 0 END, "
                    "hold_count FROM %s WHERE resource_name = %%s" % (now, LOCKS),
                    (LOCK.encode() if not PG else LOCK,))
        r = cur.fetchone()
        if r is None:
            return None
        tok = r[0].decode() if isinstance(r[0], (bytes, bytearray)) else r[0]
        return tok, int(r[1]), int(r[2]), int(r[3])
    finally:
        cur.close()


def written_by(token, session, patience_s):
    """True/False: the items log has a row of `token`, read once the server session `session`
    (whose COMMIT went unanswered) has ended, so that its outcome is final; None when the server
    never answered within `patience_s`."""
    end = time.monotonic() + patience_s
    started = time.monotonic()
    alive = ("SELECT count(*) FROM pg_stat_activity WHERE pid = %s" if PG else
             "SELECT count(*) FROM information_schema.processlist WHERE id = %s")
    kill = "SELECT pg_terminate_backend(%s)" if PG else "KILL CONNECTION %s"
    while True:
        try:
            c = connect(ARGS["direct"])
            try:
                cur = c.cursor()
                while True:
                    cur.execute(alive, (session,))
                    if cur.fetchone()[0] == 0:
                        break
                    if time.monotonic() - started > 5:
                        try:
                            cur.execute(kill, (session,))
                            if PG:
                                cur.fetchall()
                        except driver.Error:
                            pass  # gone meanwhile
                    if time.monotonic() > end:
                        return None
                    time.sleep(0.05)
                cur.execute("SELECT count(*) FROM %s WHERE token = %%s" % ITEMS, (token,))
                return cur.fetchone()[0] > 0
            finally:
                c.close()
        except driver.Error:
            if time.monotonic() > end:
                return None
            time.sleep(0.05)


def session_of(conn):
    """The server session (PostgreSQL backend pid, MySQL connection id) of `conn`."""
    return conn.get_backend_pid() if PG else conn.thread_id()


def main():
    log("S %d" % os.getpid())
    conn = None
    direct = None
    while not os.path.exists(STOP):
        if conn is None:
            try:
                conn = connect(ARGS["url"])
            except driver.Error as e:
                log("E connect: %s" % str(e).replace("\n", " ")[:200])
                time.sleep(random.uniform(0.005, 0.03))
                continue
        token = "py%d.%08x" % (ID, random.getrandbits(32))
        asked = mono_ns()
        try:
            fence = one(conn, ACQUIRE, (LOCK, token, TTL))
        except driver.Error as e:
            # Maybe granted (the reply was lost): nobody renews it, it runs out at its TTL.
            log("E acquire: %s" % str(e).replace("\n", " ")[:200])
            conn = close(conn)
            time.sleep(random.uniform(0.005, 0.03))
            continue
        if fence is None:
            # Not acquired: the row must not carry our token (a grant we were never told of).
            try:
                if direct is None:
                    direct = connect(ARGS["direct"])
                r = row_of(direct)
                if r and r[0] == token and r[2] == 1 and r[3] > 0:
                    log("N %d" % r[1])
            except driver.Error as e:
                log("E check: %s" % str(e).replace("\n", " ")[:200])
                direct = close(direct)
            time.sleep(random.uniform(0.001, 0.01))
            continue
        fence = int(fence)
        enter = mono_ns()
        log("G %d %d" % (fence, enter))
        set_slot(fence)
        if WORK > 0:
            time.sleep(random.uniform(0, WORK) / 1000.0)
        set_slot(-fence)
        if CHECK_VALID and mono_ns() - asked >= TTL * 750000:
            # Past three quarters of the TTL since it was asked for (a late reply, a stall): the
            # lease may be another's by now, so this holder refuses to use it, as the library's
            # guard.valid() does; a later fence may have been granted before this one returned.
            log("V %d" % fence)
        else:
            log("A %d" % fence)
            conn = write(conn, fence, token, enter)
        set_slot(0)
        log("r %d %d" % (fence, mono_ns()))
        if conn is not None:
            try:
                one(conn, RELEASE, (LOCK, token, fence))
            except driver.Error:
                conn = close(conn)  # lost or in doubt: the lease runs out at its TTL
        if IDLE > 0:
            time.sleep(random.uniform(0, IDLE) / 1000.0)
    return 0


def close(c):
    try:
        if c is not None:
            c.close()
    except Exception:
        pass
    return None


def write(conn, fence, token, enter):
    """The fenced increment; returns the connection to go on with (None once it broke)."""
    committing = False
    session = session_of(conn)
    try:
        cur = conn.cursor()
        cur.execute("BEGIN")
        if FENCED:
            cur.execute(CHECK, (LOCK, fence))
            if not PG:
                while cur.nextset():
                    pass
        cur.execute("SELECT n FROM %s WHERE id = 1" % COUNTER)
        n = int(cur.fetchone()[0]) + 1
        if IN_TXN > 0:
            time.sleep(random.uniform(0, IN_TXN) / 1000.0)
        cur.execute("UPDATE %s SET n = %%s WHERE id = 1" % COUNTER, (n,))
        cur.execute("INSERT INTO %s (n, fence, worker, token) VALUES (%%s, %%s, %%s, %%s)" % ITEMS,
                    (n, fence, 100 + ID, token))
        committing = True
        cur.execute("COMMIT")
        log("K %d %d %d %d" % (fence, n, enter, mono_ns()))
        return conn
    except driver.Error as e:
        if not committing and sqlstate(e) == "DL001":
            log("L %d" % fence)
            try:
                conn.cursor().execute("ROLLBACK")
                return conn
            except driver.Error:
                return close(conn)
        if not committing:
            log("X %d %s" % (fence, str(e).replace("\n", " ")[:120]))
            return close(conn)  # the server rolls back a transaction whose connection ends
        # COMMIT was sent: it may have landed.
        close(conn)
        w = written_by(token, session, 60)
        if w is None:
            log("E unresolved in_doubt for fence %d" % fence)
        else:
            log("D %d %d" % (fence, 1 if w else 0))
        return None


if __name__ == "__main__":
    sys.exit(main())
