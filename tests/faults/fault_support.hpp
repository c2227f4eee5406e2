// Shared pieces of the fault-injection suite: trial counts, the fenced counter workload run by
// worker processes, the parent's analysis of what they acknowledged, and the report lines.
//
// The counter workload: each worker loops acquire lease -> (work) -> fenced { read counter n;
// write n+1; insert (n+1, fence, owner token) into the items log } -> release, and appends every
// outcome to its own log file with O_APPEND (so a SIGKILL loses nothing already reported):
//   G <fence> <enter_ns>          granted (CLOCK_MONOTONIC read by a raw syscall, so libfaketime
//                                 cannot skew it)
//   A <fence>                     about to write
//   K <fence> <n> <enter> <exit>  acknowledged: fenced() returned, counter value n is ours
//                                 (exit: when its statements had run, before the COMMIT)
//   L <fence>                     lease_lost: nothing written
//   X <fence>                     another error before COMMIT: rolled back, nothing written
//   D <fence> <0|1>               in_doubt, resolved by reading the items log by owner token
//   V <fence>                     skipped: the guard's local validity had run out
//   N <fence>                     VIOLATION: try_acquire said "not acquired" while the row
//                                 carried an unexpired lease of ours that we never got
//   E <text>                      any other error (acquire failed, ...)
//   r <fence> <ns>                about to release (CLOCK_MONOTONIC, raw): the hold ends here
//
// Exactness, defined precisely: with c = the counter, R = the rows of the items log ordered by
// n, K = acknowledged fences, D1/D0 = in_doubt fences resolved as written/not written, and M =
// fences with an "A" but no outcome (the worker was killed mid-write):
//   c == |R|, R's n are exactly 1..c, fences strictly increase along R (no stale write ever
//   committed after a newer holder's), every K and D1 fence is in R with its n, no D0 fence is
//   in R, every fence in R is in K, D1 or M; so |K| + |D1| <= c <= |K| + |D1| + |M|.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"

namespace dblock::test::faults {

// The fault tests' vocabulary: `using namespace dblock::test::faults` brings dblock's API and the
// harness along with the helpers below.
using namespace dblock;
using namespace dblock::test;

/// True with DBLOCK_FAULTS_FULL=1: run the full trial counts instead of the reduced CI ones.
bool full();
/// `reduced` (half of it, at least 1, in a sanitizer build), or `full_count` under
/// DBLOCK_FAULTS_FULL=1.
int count(int reduced, int full_count);

/// CLOCK_MONOTONIC by a raw system call (not intercepted by libfaketime).
long long raw_monotonic_ns();

/// What the proxy matches to find the lease acquire (or renew/release) request of `url`'s
/// backend on the wire: PostgreSQL runs them as prepared statements, so after the first use only
/// the statement name travels ("dblock_lease_acquire"); MySQL sends the SQL text every time.
std::string acquire_request_pattern(const std::string& url, const std::string& lock_table);
std::string renew_release_request_pattern(const std::string& url, const std::string& lock_table);

/// Creates the workload's "counter" (one row, n = 0) and "items" tables.
void create_workload_tables(const context& ctx);

/// Settings of the counter workers; turned into key=value worker arguments.
struct workload {
  std::string url;         // what dblock connects to (maybe through a proxy)
  std::string direct_url;  // for in_doubt resolution and row checks (never proxied)
  std::string prefix;
  std::string lock;
  std::string dir;  // logs: <dir>/w<id>.log; stop file: <dir>/stop
  int ttl_ms = 1000;
  int work_ms = 2;          // random work 0..work_ms between acquire and write
  bool fenced = true;       // false: plain autocommit read/write (negative control)
  bool check_valid = true;  // skip the write when guard.valid() is false
  bool try_mode = false;    // try_acquire loop with the "N" check instead of acquire(wait)
  int poll_max_ms = 50;
  int pool = 3;
  std::string slots;      // "" or a file of shared int64 slots: slot[id] = fence while before-write
  int in_txn_ms = 0;      // sleep inside the fenced transaction (widens kill windows)
  int idle_ms = 0;        // random pause 0..idle_ms after each release (room for other acquirers)
  bool own_lock = false;  // negative control: one lock per worker, i.e. no exclusion at all
  // "lease", "semaphore" (the one permit of a semaphore of 1 named `lock`) or "election" (the
  // leadership of the election `lock`; the worker's identity is "w<id>")
  std::string kind = "lease";
  std::vector<std::string> args(int id) const;
};

/// Starts worker `id` of `w`; returns its pid.
int spawn_counter_worker(process_set& ps, const workload& w, int id,
                         const std::vector<std::string>& env = {});

/// Starts worker `id` of `w` as a client of the SQL API (tests/faults/sql_worker.py: Python with
/// psycopg2 or MySQLdb, the same loop and log lines, the lease taken, fence-checked and released
/// through the routines of docs/sql-api.md); `w.kind` must be "lease". PostgreSQL and MySQL only.
int spawn_sql_worker(process_set& ps, const workload& w, int id);

/// Starts `n` workers of `w` (ids 0..n-1): counter workers, except the last `sql_workers`, which
/// are SQL API workers. Returns their pids by id.
std::vector<int> spawn_mixed_workers(process_set& ps, const workload& w, int n, int sql_workers);

/// Records that worker `id` was killed on purpose (SIGKILL): analyze() does not require its log.
void mark_killed(const workload& w, int id);

/// Creates <dir>/stop, which ends every worker's loop after its current iteration.
void stop_workers(const workload& w);

/// The last `lines` lines of worker `id`'s log, for the message of a failed exit check.
std::string worker_log_tail(const workload& w, int id, int lines = 12);

/// The counter workload on `url` (checked on the same server) with table prefix `prefix`, lock
/// "<stem>-<random suffix>", its logs in `dir` and leases of `ttl_ms`; the rest as declared above.
workload make_workload(const std::string& url, const std::string& prefix, const std::string& stem,
                       const temp_dir& dir, int ttl_ms);
/// The same on the test's own database.
inline workload make_workload(const context& ctx, const std::string& stem, const temp_dir& dir,
                              int ttl_ms) {
  return make_workload(ctx.url, ctx.prefix, stem, dir, ttl_ms);
}

/// Lines of kind `k` ("K", "E", ...) in the logs of workers [from, to) so far (the logs are
/// appended as the workers go, so this also reads a running workload).
long long log_lines(const workload& w, int from, int to, const std::string& k);

/// Waits while `progressed()` is false, polling every 100 ms, for at most `most`, and returns
/// progressed(); `tick` (if any) runs on every poll (a fault loop that keeps going meanwhile).
/// A workload that made no progress in its usual window on a loaded or instrumented machine is
/// given more time, so that only one that makes none at all fails its progress check: a check
/// that fails because the machine is slow measures the machine, not dblock.
bool wait_for_progress(const std::function<bool()>& progressed, std::chrono::milliseconds most,
                       const std::function<void()>& tick = {});

/// Waits for every worker of `ps` (at most `timeout`) and checks that each exited with 0, showing
/// the end of its log when not.
void require_clean_exit(process_set& ps, const workload& w, std::chrono::seconds timeout);

/// What the parent found.
struct analysis {
  long long counter = 0, rows = 0, grants = 0, acked = 0, lost = 0, rolled_back = 0;
  long long doubt_written = 0, doubt_not_written = 0, killed_mid_write = 0, invalid_skips = 0;
  long long errors = 0, overlaps = 0, missing_logs = 0;
  long long violations = 0;  // every broken invariant, counted
  std::vector<std::string> problems;
  std::vector<std::string> error_samples;  // the first few "E" lines of the workers' logs
  std::vector<long long> ack_exit_ns;      // for recovery times
  std::string summary() const;
};

/// Reads every worker log of `w.dir` and the tables through `db`; `check_overlap` adds the
/// CLOCK_MONOTONIC non-overlap of acknowledged sections and grant order (not under pauses).
analysis analyze(const database& db, const context& ctx, const workload& w, bool check_overlap);

/// Prints one line of the scenario x backend table and appends it to $DBLOCK_FAULTS_REPORT.
void report(const std::string& scenario, const std::string& backend, long long trials,
            long long faults, long long violations, const std::string& extra = "");

/// The value of the environment variable `name`, which scripts/test-servers.sh exports to give
/// the tests control of its servers (a command that restarts one, an admin URL, a pid file, the
/// topologies). Unset or empty: the test is skipped (skip_test), for a run against servers of
/// one's own (scripts/test.sh with DBLOCK_TEST_EXTERNAL_MYSQL_URL); under CI=true a failure.
std::string env_or_fail(const char* name);

/// Which server process runs now, through a connection of its own (retried for 20 s while the
/// server comes back): PostgreSQL's postmaster start time, MariaDB's process id from its pid
/// file (the test servers run on this host). A different answer proves a restart in between.
std::string server_instance(const context& ctx);

/// Runs a shell command (from an environment variable) with an argument; true on status 0. The
/// variable unset: skipped as env_or_fail says.
bool run_env_cmd(const char* var, const std::string& arg);

/// Random integer in [lo, hi].
long long rnd(long long lo, long long hi);

/// A file of int64 slots shared (mmap) between the parent and workers.
struct shared_slots {
  long long* v = nullptr;
  int n = 0;
  shared_slots(const std::string& path, int count, bool create);
  ~shared_slots();
  shared_slots(const shared_slots&) = delete;
  shared_slots& operator=(const shared_slots&) = delete;
};

/// True once the process `pid` is in the stopped state ('T').
bool wait_stopped(int pid, std::chrono::milliseconds timeout);

}  // namespace dblock::test::faults
