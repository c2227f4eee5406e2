// Scenario 3 (docs/safety.md T4, S1): holders are paused with SIGSTOP for 1.5 x TTL or 3 x TTL
// after their acquire returned and before their fenced write began (the worker publishes that phase
// in a shared slot; the parent reads it again once the process is stopped, so a trial counts only
// when the pause really fell there). After SIGCONT the stale holder attempts its fenced write,
// which must be refused: zero stale fenced writes accepted, fences strictly increasing in commit
// order, exact counts. Negative control: the same pauses with plain (unfenced) writes must be
// caught as stale writes or lost updates.
#include <signal.h>
#include <unistd.h>

#include <set>
#include <sstream>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"

using namespace dblock::test::faults;

namespace {

struct pause_result {
  analysis a;
  long long trials = 0;          // pauses that fell between acquire and write
  long long stale_accepted = 0;  // of those, writes acknowledged anyway
  long long sql_trials = 0;      // of those, pauses of a SQL API worker
};

// `sql_workers` of the 4 workers (the last ones) are Python clients of the SQL API; every other
// trial pauses one of them when one is between acquire and write.
pause_result run_pauses(context& ctx, bool fenced, int trials, const std::string& kind = "lease",
                        int sql_workers = 0) {
  const int ttl_ms = 300;
  create_workload_tables(ctx);
  temp_dir dir("faults-pause");
  auto w = make_workload(ctx, "pause", dir, ttl_ms);
  w.work_ms = 120;
  w.fenced = fenced;
  w.kind = kind;
  w.check_valid = false;  // the stale holder must really try to write
  w.poll_max_ms = 20;
  w.slots = dir.file("slots");
  shared_slots slots(w.slots, 64, true);
  process_set ps;
  const int cpp_workers = 4 - sql_workers;
  const std::vector<int> pids = spawn_mixed_workers(ps, w, 4, sql_workers);
  std::this_thread::sleep_for(milliseconds(800));
  pause_result r;
  std::set<long long> paused_fences;
  const long long deadline = monotonic_ns() + 240LL * 1000000000LL;
  while (r.trials < trials && monotonic_ns() < deadline) {
    // A holder already paused once is not paused again before its write: right after SIGCONT
    // its slot still shows the same fence, and a second pause of that one acquire would count
    // two trials for the one lease_lost it can report.
    int victim = -1;
    const int first = sql_workers > 0 && r.trials % 2 == 1 ? cpp_workers : 0;
    for (int spin = 0; spin < 2000 && victim < 0; ++spin) {
      for (int i = first; i < 4; ++i) {
        const long long f = __atomic_load_n(&slots.v[i], __ATOMIC_SEQ_CST);
        if (f > 0 && !paused_fences.count(f)) victim = i;
      }
      if (victim < 0) std::this_thread::sleep_for(milliseconds(1));
    }
    if (victim < 0) continue;
    ::kill(pids[victim], SIGSTOP);
    if (!wait_stopped(pids[victim], std::chrono::seconds(5))) {
      ::kill(pids[victim], SIGCONT);
      continue;
    }
    long long fence = __atomic_load_n(&slots.v[victim], __ATOMIC_SEQ_CST);
    // Still between acquire and write while stopped, and an acquire not paused before.
    bool counts = fence > 0 && !paused_fences.count(fence);
    std::this_thread::sleep_for(milliseconds(r.trials % 2 == 0 ? ttl_ms * 3 / 2 : ttl_ms * 3));
    // Stopped until a successor has written under a newer fence (30 s at most): then a stale
    // write by the paused holder is one the analysis catches, at any speed of the machine (a
    // successor slow to take over would leave nothing for the unfenced control to show).
    if (counts)
      wait_for_progress(
          [&] {
            for (int i = 0; i < 4; ++i) {
              if (i == victim) continue;
              std::istringstream in(read_file(dir.file("w" + std::to_string(i) + ".log")));
              std::string line, k;
              long long f = 0;
              while (std::getline(in, line)) {
                std::istringstream l(line);
                if (l >> k >> f && k == "K" && f > fence) return true;
              }
            }
            return false;
          },
          std::chrono::seconds(30));
    ::kill(pids[victim], SIGCONT);
    if (counts) {
      ++r.trials;
      if (victim >= cpp_workers) ++r.sql_trials;
      paused_fences.insert(fence);
    }
    std::this_thread::sleep_for(milliseconds(rnd(0, ttl_ms)));
  }
  stop_workers(w);
  require_clean_exit(ps, w, std::chrono::seconds(90));
  // No overlap check: a holder stopped past its TTL still thinks it holds the lease when it
  // wakes, so its section overlaps its successor's in time by design (S2 assumes a running
  // process); what is promised, and checked, is that its write is refused (its fence is stale).
  r.a = analyze(ctx.db, ctx, w, false);
  // A paused fence that was acknowledged is a stale write accepted.
  for (int i = 0; i < 4; ++i) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(i) + ".log")));
    std::string k;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      long long f = 0;
      if (l >> k >> f && k == "K" && paused_fences.count(f)) ++r.stale_accepted;
    }
  }
  return r;
}

}  // namespace

namespace {

// Fenced pauses of the lock `kind`: every paused holder is refused (lease_lost) and nothing
// stale is accepted. `sql_workers` of the 4 workers are Python clients of the SQL API, and at
// least one of them is paused.
void check_fenced_pauses(context& ctx, const std::string& kind, int trials,
                         const std::string& scenario, int sql_workers = 0) {
  auto r = run_pauses(ctx, true, trials, kind, sql_workers);
  INFO(r.a.summary() << "\npaused trials " << r.trials << " (" << r.sql_trials
                     << " of SQL workers), stale writes accepted " << r.stale_accepted);
  CHECK(r.trials == trials);
  if (sql_workers > 0) CHECK(r.sql_trials > 0);
  CHECK(r.stale_accepted == 0);
  CHECK(r.a.violations == 0);
  CHECK(r.a.lost >= r.trials);  // every paused holder was told lease_lost
  report(scenario, ctx.backend, r.trials, r.trials, r.stale_accepted + r.a.violations,
         "acked=" + std::to_string(r.a.acked) + " lease_lost=" + std::to_string(r.a.lost) +
             " sql_trials=" + std::to_string(r.sql_trials));
}

// The negative control: holders that write without the fence (C++ workers) or without
// dblock_check_fence() (`sql_workers` of them Python) are caught writing stale after a pause.
void check_unfenced_pauses(context& ctx, int sql_workers, const std::string& scenario) {
  auto r = run_pauses(ctx, false, 4, "lease", sql_workers);
  INFO(r.a.summary() << "\npaused trials " << r.trials << ", stale writes accepted "
                     << r.stale_accepted);
  CHECK(r.stale_accepted > 0);
  CHECK(r.a.violations > 0);
  report(scenario, ctx.backend, r.trials, r.trials, r.stale_accepted + r.a.violations,
         "expected=violations>0");
}

}  // namespace

DBLOCK_TEST("holders paused 1.5 x TTL and 3 x TTL: zero stale fenced writes accepted",
            "[faults][pause]") {
  check_fenced_pauses(ctx, "lease", count(10, 100), "3-paused-holder");
}

// The same with the lock being the one permit of a semaphore: a paused permit holder's fenced
// write is refused once its permit was taken over.
DBLOCK_TEST("semaphore permits paused 1.5 x TTL and 3 x TTL: zero stale fenced writes accepted",
            "[faults][pause][semaphore]") {
  check_fenced_pauses(ctx, "semaphore", count(6, 60), "3-paused-permit-holder");
}

// The same with the lock being the leadership of an election: a paused leader's watchdog and
// monitor thread are stopped with it, and its fenced write is refused once another candidate won.
DBLOCK_TEST("leaders paused 1.5 x TTL and 3 x TTL: zero stale fenced writes accepted",
            "[faults][pause][election]") {
  check_fenced_pauses(ctx, "election", count(6, 60), "3-paused-leader");
}

// The same with two of the four workers Python clients of the SQL API (docs/sql-api.md): a
// paused holder's dblock_check_fence() refuses (DL001) and its transaction writes nothing.
DBLOCK_TEST_SERVERS("SQL API: C++ and Python holders paused past the TTL: zero stale writes",
                    "[faults][pause][sql_api]") {
  // Fewer under the sanitizers: the Python side gains nothing there.
  check_fenced_pauses(ctx, "lease", count(sanitized_build() ? 4 : 6, 60), "3-paused-holder-sql-api",
                      2);
}

// Its control: Python workers that skip dblock_check_fence() are caught writing stale.
DBLOCK_TEST_SERVERS("negative control: paused SQL API holders writing without the check",
                    "[faults][pause][sql_api][control]") {
  check_unfenced_pauses(ctx, 4, "control-3-unfenced-pause-sql-api");
}

DBLOCK_TEST("negative control: paused holders writing without the fence are caught",
            "[faults][pause][control]") {
  check_unfenced_pauses(ctx, 0, "control-3-unfenced-pause");
}
