// Scenario 1 (docs/safety.md T6): the database restarts under the 8-process fenced counter workload
// (PostgreSQL: pg_ctl restart -m immediate; MariaDB: kill -9 and start again), and on every
// backend worker processes are killed with SIGKILL, often inside their write transaction.
// Checked: exact counts as defined in fault_support.hpp (every acknowledged increment survives),
// fences strictly increasing in commit order and unique per grant (no double grant), acknowledged
// sections do not overlap on CLOCK_MONOTONIC, and after each restart some client acknowledges an
// increment within 2 x TTL of the server being back (restart time + 2 x TTL from its start).
#include <signal.h>
#include <soci/soci.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"

using namespace dblock::test::faults;

namespace {

// True when another server process runs than the one `before` names (server_instance()).
bool restarted_since(const context& ctx, const std::string& before) {
  return server_instance(ctx) != before;
}

// What a run of the 8-process fenced counter workload under server restarts saw.
struct restart_run {
  analysis a;
  int failed = 0;        // restart commands that failed
  int restarted = 0;     // restarts proven by the server's start time
  long long late = 0;    // restarts after which no increment was acknowledged within the bound
  std::string recovery;  // per restart: its duration + the first acknowledgement after it
};

// Runs 8 counter workers on `w`, restarts the server `restarts` times with `$cmd_var arg`
// (2.5-3.5 s apart), stops the workers and analyses the run (reopening ctx.db: the old pool's
// connections died with the server).
restart_run run_with_restarts(context& ctx, const workload& w, const char* cmd_var,
                              const std::string& arg, int restarts) {
  (void)env_or_fail(cmd_var);  // before any worker runs
  process_set ps;
  for (int i = 0; i < 8; ++i)
    spawn_counter_worker(ps, w, i);
  std::this_thread::sleep_for(milliseconds(1500));
  std::vector<std::pair<long long, long long>> windows;  // restart start, server back
  std::vector<long long> bounds;  // each recovery's bound: 2 x TTL + the slack at the pace then
  restart_run out;
  for (int r = 0; r < restarts; ++r) {
    const std::string started = server_instance(ctx);
    const long long t0 = monotonic_ns();
    if (!run_env_cmd(cmd_var, arg)) ++out.failed;
    windows.push_back({t0, monotonic_ns()});
    const long long acked_before = log_lines(w, 0, 8, "K");
    if (restarted_since(ctx, started)) ++out.restarted;  // evidence, not an exit status
    bounds.push_back(liveness_bound_ms(2 * w.ttl_ms, median_round_trip_us(ctx.open())));
    std::this_thread::sleep_for(milliseconds(rnd(2500, 3500)));
    // A write after the restart before the next one (more time on a slow machine: the bound
    // below judges how soon it came).
    wait_for_progress([&] { return log_lines(w, 0, 8, "K") > acked_before; },
                      std::chrono::seconds(60));
  }
  stop_workers(w);
  require_clean_exit(ps, w, std::chrono::seconds(90));
  ctx.db = ctx.open();
  out.a = analyze(ctx.db, ctx, w, true);
  for (std::size_t i = 0; i < windows.size(); ++i) {
    const auto& win = windows[i];
    auto it = std::upper_bound(out.a.ack_exit_ns.begin(), out.a.ack_exit_ns.end(), win.second);
    long long rec_ms = it == out.a.ack_exit_ns.end() ? -1 : (*it - win.second) / 1000000;
    out.recovery += " " + std::to_string((win.second - win.first) / 1000000) + "+" +
                    std::to_string(rec_ms) + "ms(bound " + std::to_string(bounds[i]) + ")";
    if (rec_ms < 0 || rec_ms > bounds[i]) ++out.late;
  }
  return out;
}

// What every run with restarts shows: each restart made and seen, no broken invariant, no late
// recovery, and acknowledged writes.
void check_restart_run(const restart_run& run, int restarts) {
  CHECK(run.failed == 0);
  CHECK(run.restarted == restarts);
  CHECK(run.a.violations == 0);
  CHECK(run.late == 0);
  CHECK(run.a.acked > 0);
}

// The variable naming the command that restarts the test's server (test-servers.sh sets it).
const char* restart_cmd_var(const context& ctx) {
  const char* var =
      ctx.backend == "postgresql" ? "DBLOCK_TEST_PG_RESTART_CMD" : "DBLOCK_TEST_MYSQL_RESTART_CMD";
  (void)env_or_fail(var);
  return var;
}

}  // namespace

DBLOCK_TEST_SERVERS("server restart mid-run: 8 fenced counter processes survive restarts",
                    "[faults][restart][serial]") {
  const bool pg = ctx.backend == "postgresql";
  const char* cmd_var = restart_cmd_var(ctx);
  const int ttl_ms = 1000;
  const int restarts = count(2, 5);
  create_workload_tables(ctx);
  temp_dir dir("faults-restart");
  auto w = make_workload(ctx, "counter", dir, ttl_ms);
  // Control of the evidence: without a restart, the same server process answers.
  CHECK_FALSE(restarted_since(ctx, server_instance(ctx)));
  auto run = run_with_restarts(ctx, w, cmd_var, pg ? "immediate" : "KILL", restarts);
  const analysis& a = run.a;
  INFO(a.summary());
  INFO("restart duration + recovery after it:" << run.recovery);
  check_restart_run(run, restarts);
  report("1-server-restart", ctx.backend, restarts, restarts - run.failed, a.violations + run.late,
         "acked=" + std::to_string(a.acked) + " in_doubt=" +
             std::to_string(a.doubt_written + a.doubt_not_written) + " recovery=" + run.recovery);
}

// A release acknowledged just before the server is killed with SIGKILL (PostgreSQL: the
// postmaster and every server process; MariaDB: mariadbd). On PostgreSQL a release that frees a
// lease commits without waiting for the WAL flush (the next grant's commit flushes it), so the
// crash may undo it: the row then shows the released holder until its TTL. Checked: after the
// crash the row is free, or held by the released token with its fence; the next grant comes no
// earlier than that expiry on the database clock and has a higher fence. MariaDB's release
// waits for its redo log, so there the lease must be free at once.
DBLOCK_TEST_SERVERS("a release acknowledged just before a server crash: free at once or at its TTL",
                    "[faults][restart][serial]") {
  const bool pg = ctx.backend == "postgresql";
  const char* cmd_var = restart_cmd_var(ctx);
  dblock::lease_options lo;
  lo.ttl = milliseconds(3000);
  const int rounds = count(3, 8);
  int undone = 0, violations = 0;
  for (int r = 0; r < rounds; ++r) {
    const std::string name = "crash-release-" + random_suffix();
    std::optional<dblock::detail::lease_row> held;
    {
      dblock::lease_lock lock(ctx.db, name, lo);
      auto g = lock.try_acquire();
      REQUIRE(g);
      held = read_lease(ctx.db.connect(), name);
      REQUIRE(held);
      g->release();
    }
    const std::string started = server_instance(ctx);
    REQUIRE(run_env_cmd(cmd_var, pg ? "kill9" : "KILL"));
    REQUIRE(restarted_since(ctx, started));  // the crash happened
    ctx.db = ctx.open();
    auto after = read_lease(ctx.db.connect(), name);
    REQUIRE(after);
    INFO("round " << r << ": hold_count " << after->hold_count << " after the crash");
    const bool was_undone = after->hold_count != 0;
    bool ok = after->fence == held->fence;
    if (was_undone) {
      ++undone;
      // Only PostgreSQL's release may be undone, and then to the released holder's row.
      ok = ok && pg && after->owner_token == held->owner_token &&
           after->expires_at_us == held->expires_at_us;
    }
    dblock::lease_lock next(ctx.db, name, lo);
    auto g = next.acquire(milliseconds(10000));
    auto now = read_lease(ctx.db.connect(), name);
    REQUIRE(now);
    ok = ok && g.fence() > held->fence;
    if (was_undone) ok = ok && now->acquired_at_us >= held->expires_at_us;
    INFO("fence " << held->fence << " -> " << g.fence() << ", granted at " << now->acquired_at_us
                  << " us, the released lease expired at " << held->expires_at_us << " us");
    CHECK(ok);
    if (!ok) ++violations;
    g.release();
  }
  INFO("releases undone by the crash: " << undone << " of " << rounds);
  report("release-before-crash", ctx.backend, rounds, rounds, violations,
         "undone=" + std::to_string(undone) + " of " + std::to_string(rounds));
}

namespace {

// Whether worker `id`'s log ends inside a write: an "A" with no outcome (K, L, X, D) after it,
// what analyze() counts as killed_mid_write. Read once the worker is dead.
bool log_ends_mid_write(const workload& w, int id) {
  std::istringstream in(read_file(w.dir + "/w" + std::to_string(id) + ".log"));
  std::string line, k;
  long long pending = 0;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    long long f = 0;
    if (!(l >> k >> f)) continue;
    if (k == "A") pending = f;
    if ((k == "K" || k == "L" || k == "X" || k == "D") && f == pending) pending = 0;
  }
  return pending != 0;
}

}  // namespace

// On every backend (the SQLite part of scenario 1): writers are killed with SIGKILL at random
// moments, many of them inside BEGIN ... COMMIT of their fenced write; replacements keep going.
DBLOCK_TEST("writers killed with SIGKILL mid-transaction: nothing acknowledged is lost",
            "[faults][restart]") {
  const int ttl_ms = 500;
  const int kills = count(6, 40);
  // Whether a kill lands inside a write depends on the machine's pace (the victim may finish its
  // write between the parent's look at its slot and the signal): each kill's victim log says
  // whether it did, and while none has, the storm goes on, up to 4 x `kills` kills.
  const int most_kills = 4 * kills;
  create_workload_tables(ctx);
  temp_dir dir("faults-kill");
  auto w = make_workload(ctx, "counter", dir, ttl_ms);
  w.in_txn_ms = 20;
  w.slots = dir.file("slots");
  shared_slots slots(w.slots, 64, true);
  process_set ps;
  std::vector<int> pids, ids;
  int next_id = 0;
  for (; next_id < 6; ++next_id) {
    pids.push_back(spawn_counter_worker(ps, w, next_id));
    ids.push_back(next_id);
  }
  std::this_thread::sleep_for(milliseconds(800));
  int made = 0, landed_mid_write = 0;
  for (; made < kills || (landed_mid_write == 0 && made < most_kills); ++made) {
    std::this_thread::sleep_for(milliseconds(rnd(100, 400)));
    // Prefer a worker that is writing (its slot holds -fence from just before fenced() until
    // it returns), so that most kills land inside the transaction.
    auto victim = static_cast<std::size_t>(rnd(0, static_cast<long long>(pids.size()) - 1));
    for (int spin = 0; spin < 200; ++spin) {
      auto i = static_cast<std::size_t>(rnd(0, static_cast<long long>(pids.size()) - 1));
      if (__atomic_load_n(&slots.v[pids.size() > i ? ids[i] : 0], __ATOMIC_SEQ_CST) < 0) {
        victim = i;
        break;
      }
      std::this_thread::sleep_for(milliseconds(1));
    }
    ::kill(pids[victim], SIGKILL);
    ps.wait(pids[victim], std::chrono::seconds(10));
    mark_killed(w, ids[victim]);
    if (log_ends_mid_write(w, ids[victim])) ++landed_mid_write;
    ids[victim] = next_id;
    pids[victim] = spawn_counter_worker(ps, w, next_id++);
  }
  if (made > kills)
    WARN("no kill of the first " << kills << " landed inside a write at the pace of this machine; "
                                 << made << " kills made, " << landed_mid_write << " landed");
  // The survivors take the orphaned leases; a slow machine gets more time (at most a minute) for
  // an acknowledged write after the last kill, rather than a failed "acked > 0".
  const long long acked_at_last_kill = log_lines(w, 0, next_id, "K");
  std::this_thread::sleep_for(milliseconds(2 * ttl_ms));
  wait_for_progress([&] { return log_lines(w, 0, next_id, "K") > acked_at_last_kill; },
                    std::chrono::seconds(60));
  stop_workers(w);
  require_clean_exit(ps, w, std::chrono::seconds(90));
  auto a = analyze(ctx.db, ctx, w, true);
  INFO(a.summary());
  INFO(made << " kills, " << landed_mid_write << " inside a write by the victims' logs");
  CHECK(a.violations == 0);
  CHECK(a.acked > 0);
  // Evidence that the fault is the one named: some kill landed between a write's start and its
  // outcome (an attempted fence with no outcome in its worker's log).
  CHECK(a.killed_mid_write > 0);
  report("1-kill9-writer", ctx.backend, made, made, a.violations,
         "acked=" + std::to_string(a.acked) +
             " killed_mid_write=" + std::to_string(a.killed_mid_write) +
             " landed_mid_write=" + std::to_string(landed_mid_write));
}

// Negative control of the workload and its analysis: the same processes, but each with its own
// lock and plain autocommit writes, i.e. no exclusion. The analysis must find violations.
DBLOCK_TEST("negative control: the counter workload without exclusion is caught failing",
            "[faults][control]") {
  create_workload_tables(ctx);
  temp_dir dir("faults-ctl");
  auto w = make_workload(ctx, "counter", dir, 1000);
  w.own_lock = true;
  w.fenced = false;
  w.work_ms = 0;
  w.in_txn_ms = 0;
  process_set ps;
  for (int i = 0; i < 4; ++i)
    spawn_counter_worker(ps, w, i);
  std::this_thread::sleep_for(milliseconds(1500));
  // On a busy machine, on until the four have written 200 times (their writes interleave).
  wait_for_progress([&] { return log_lines(w, 0, 4, "K") >= 200; }, std::chrono::seconds(60));
  stop_workers(w);
  require_clean_exit(ps, w, std::chrono::seconds(90));
  auto a = analyze(ctx.db, ctx, w, true);
  INFO(a.summary());
  CHECK(a.violations > 0);
  report("control-no-exclusion", ctx.backend, 1, 0, a.violations, "expected=violations>0");
}

// Controls of each detector of analyze() alone, on histories written by hand into the worker
// logs and the tables (the control above breaks exclusion and fences together): a stale-fence
// write with sections that do not overlap, overlapping sections with fences in order, a log
// missing from a started worker, and the clean history that must pass (so that the three
// failures are the detectors', not the set-up's).
namespace {

struct history {
  std::vector<std::pair<long long, long long>> rows;  // n, fence, in commit order
  std::map<int, std::string> logs;                    // worker id -> log text
  std::vector<int> started;                           // workers marked as spawned
};

analysis analyze_history(context& ctx, const history& h, bool check_overlap) {
  create_workload_tables(ctx);
  temp_dir dir("faults-detector");
  auto w = make_workload(ctx, "counter", dir, 1000);
  for (const auto& r : h.rows)
    ctx.exec("INSERT INTO " + ctx.table("items") + " (n, fence, worker, token) VALUES (" +
             std::to_string(r.first) + ", " + std::to_string(r.second) + ", 0, 't')");
  ctx.exec("UPDATE " + ctx.table("counter") + " SET n = " + std::to_string(h.rows.size()) +
           " WHERE id = 1");
  for (const auto& kv : h.logs)
    write_file_atomic(dir.file("w" + std::to_string(kv.first) + ".log"), kv.second);
  for (int id : h.started)
    write_file_atomic(dir.file("w" + std::to_string(id) + ".spawned"), "");
  auto a = analyze(ctx.db, ctx, w, check_overlap);
  ctx.exec("DROP TABLE " + ctx.table("items"));
  ctx.exec("DROP TABLE " + ctx.table("counter"));
  return a;
}

bool has_problem(const analysis& a, const std::string& part) {
  for (const auto& p : a.problems)
    if (p.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

DBLOCK_TEST("negative controls: each detector of the fault analysis fails on its own fault",
            "[faults][control]") {
  // Clean: two holds one after the other, fences in commit order.
  history clean;
  clean.rows = {{1, 10}, {2, 11}};
  clean.logs = {{0, "S 1\nG 10 100\nA 10\nK 10 1 100 200\n"},
                {1, "S 2\nG 11 300\nA 11\nK 11 2 300 400\n"}};
  clean.started = {0, 1};
  auto ok = analyze_history(ctx, clean, true);
  INFO("clean: " << ok.summary());
  CHECK(ok.violations == 0);

  // Stale fence alone: fence 9 commits n = 2 after fence 10 committed n = 1 (no overlap).
  history stale = clean;
  stale.rows = {{1, 10}, {2, 9}};
  stale.logs = {{0, "S 1\nG 10 100\nA 10\nK 10 1 100 200\n"},
                {1, "S 2\nG 9 50\nA 9\nK 9 2 300 400\n"}};
  auto st = analyze_history(ctx, stale, true);
  INFO("stale: " << st.summary());
  CHECK(has_problem(st, "stale write: fence 9"));
  CHECK(st.overlaps == 0);

  // Overlap alone: fence 11 enters at 150 while fence 10's section lasts until 200.
  history overlap = clean;
  overlap.logs = {{0, "S 1\nG 10 100\nA 10\nK 10 1 100 200\n"},
                  {1, "S 2\nG 11 140\nA 11\nK 11 2 150 400\n"}};
  auto ov = analyze_history(ctx, overlap, true);
  INFO("overlap: " << ov.summary());
  CHECK(ov.overlaps == 1);
  CHECK_FALSE(has_problem(ov, "stale write"));
  CHECK(ov.violations == 1);

  // A started worker without a log.
  history missing = clean;
  missing.started = {0, 1, 2};
  auto mi = analyze_history(ctx, missing, true);
  INFO("missing: " << mi.summary());
  CHECK(mi.missing_logs == 1);
  CHECK(has_problem(mi, "worker 2 was started but left no log"));
  CHECK(mi.violations == 1);
}

// #19's fast lease mode (admin.hpp set_lease_durability): the lease table is UNLOGGED, so a crash
// empties it, acknowledged grants included. The server is killed with SIGKILL (postmaster and
// every server process at once, WAL writer included) under the 8-process fenced counter
// workload. Checked as in scenario 1 (exact counts, fences strictly increasing in commit order
// and unique per grant, no overlap), and that fences after each crash start above the epoch of
// the crash's successors. Negative control: after one more crash, the same acquire statement
// without the epoch (floor 0) grants a fence at or below one acknowledged before the crash.
DBLOCK_TEST_ONLY("postgresql", "fast lease mode: kill -9 of the server under 8 fenced processes",
                 "[faults][restart][serial][fast]") {
  (void)env_or_fail("DBLOCK_TEST_PG_RESTART_CMD");
  const int ttl_ms = 1000;
  const int crashes = count(2, 5);
  create_workload_tables(ctx);
  dblock::set_lease_durability(ctx.db, dblock::lease_durability::fast);
  temp_dir dir("faults-fast");
  auto w = make_workload(ctx, "counter", dir, ttl_ms);
  auto run = run_with_restarts(ctx, w, "DBLOCK_TEST_PG_RESTART_CMD", "kill9", crashes);
  const analysis& a = run.a;
  INFO(a.summary());
  INFO("crash duration + recovery after it:" << run.recovery);
  check_restart_run(run, crashes);
  // The epoch went up at least once per crash (every worker connection after it raised it).
  long long epoch = 0, top = 0;
  {
    auto c = ctx.db.connect();
    c.session() << "SELECT epoch FROM " << ctx.prefix << "resource_lock_fence_floor WHERE id = 1",
        soci::into(epoch);
    c.session() << "SELECT MAX(fence) FROM " << ctx.table("items"), soci::into(top);
  }
  INFO("epoch " << epoch << ", highest fence written " << top);
  CHECK(epoch >= crashes + 1);
  CHECK(top >= (epoch - 8) * (1LL << 32));

  // Negative control: a grant acknowledged just before a crash, then the acquire statement with
  // floor 0 (no epoch) grants it again or lower; dblock's own acquire grants above it.
  const std::string name = "control-" + random_suffix();
  std::int64_t before = 0;
  {
    dblock::lease_lock lock(ctx.db, name);
    auto g = lock.try_acquire();
    REQUIRE(g);
    before = g->fence();
    g->release();
  }
  const std::string started = server_instance(ctx);
  REQUIRE(run_env_cmd("DBLOCK_TEST_PG_RESTART_CMD", "kill9"));
  REQUIRE(restarted_since(ctx, started));
  ctx.db = ctx.open();
  long long reissued = 0;
  {
    auto c = ctx.db.connect();
    const std::string sql = dblock::test::statements_of(ctx.db).acquire.text;
    std::string tok(32, 'c'), host = "control", thread = "1";
    long long ttl = 1000000, pid = 1, floor = 0;
    soci::indicator ind = soci::i_ok;
    c.session() << sql, soci::use(name, "name"), soci::use(tok, "token"), soci::use(ttl, "ttl"),
        soci::use(host, "host"), soci::use(pid, "pid"), soci::use(thread, "thread"),
        soci::use(floor, "floor"), soci::into(reissued, ind);
    c.session() << "DELETE FROM " << ctx.db.lock_table() << " WHERE resource_name = :n",
        soci::use(name);
  }
  INFO("acknowledged before the crash: " << before << "; without the epoch after it: " << reissued);
  CHECK(reissued <= before);  // the fence went back: what the epoch prevents
  dblock::lease_lock lock(ctx.db, name);
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(g->fence() > before);
  report("19-fast-lease-crash", ctx.backend, crashes, crashes - run.failed, a.violations + run.late,
         "acked=" + std::to_string(a.acked) + " epoch=" + std::to_string(epoch) +
             " control_reissued=" + std::to_string(reissued) + "<=" + std::to_string(before) +
             " recovery=" + run.recovery);
}
