// Waiting acquires across processes (lease_lock::acquire(wait) with the waiter queue): fair
// hand-off in arrival order, strict round-robin under constant contention (and the unfair
// negative control), exact counters under fenced writes. waiting_test.cpp has the rest (a queued
// waiter killed with SIGKILL spawns queued_worker from this file).
//
// Checks are on invariants that do not depend on timing: grant order, counts, strictly increasing
// fences, non-overlapping critical sections on CLOCK_MONOTONIC (one clock for all processes of
// this host). The few bounds on time are part of the promise and measured conservatively.
#include <signal.h>
#include <soci/soci.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "waiting_support.hpp"

using namespace dblock::test;

namespace {

// One grant as seen by the process that got it (CLOCK_MONOTONIC instants).
struct grant {
  int proc = 0;
  long long fence = 0;
  long long request_ns = 0;  // just before acquire() was called
  long long enter_ns = 0;    // just after it returned
  long long exit_ns = 0;     // just before release() was sent
};

std::string format_grants(const std::vector<grant>& gs) {
  std::ostringstream out;
  for (const auto& g : gs)
    out << g.proc << " " << g.fence << " " << g.request_ns << " " << g.enter_ns << " " << g.exit_ns
        << "\n";
  return out.str();
}

std::vector<grant> parse_grants(const std::string& text) {
  std::vector<grant> out;
  std::istringstream in(text);
  grant g;
  while (in >> g.proc >> g.fence >> g.request_ns >> g.enter_ns >> g.exit_ns)
    out.push_back(g);
  return out;
}

// Every worker's grants (files w0..w<procs-1>), in the order they were granted.
std::vector<grant> collect(const temp_dir& dir, int procs) {
  std::vector<grant> all;
  for (int i = 0; i < procs; ++i) {
    auto gs = parse_grants(read_file(dir.file("w" + std::to_string(i))));
    all.insert(all.end(), gs.begin(), gs.end());
  }
  std::sort(all.begin(), all.end(),
            [](const grant& a, const grant& b) { return a.enter_ns < b.enter_ns; });
  return all;
}

std::string order_of(const std::vector<grant>& gs) {
  std::string s;
  for (const auto& g : gs)
    s += std::to_string(g.proc) + " ";
  return s;
}

// The first breach of exclusion in grants sorted by enter_ns (a section entered before an earlier
// one exited, or a fence not above the previous grant's); "" when none.
std::string exclusion_problem(const std::vector<grant>& gs) {
  long long max_exit = 0;
  for (std::size_t i = 0; i < gs.size(); ++i) {
    if (i > 0 && gs[i].enter_ns < max_exit)
      return "grant " + std::to_string(i) + " entered " +
             std::to_string(max_exit - gs[i].enter_ns) + " ns before an earlier one exited";
    if (i > 0 && gs[i].fence <= gs[i - 1].fence)
      return "fence " + std::to_string(gs[i].fence) + " granted after fence " +
             std::to_string(gs[i - 1].fence);
    max_exit = std::max(max_exit, gs[i].exit_ns);
  }
  return "";
}

void require_success(const std::vector<int>& statuses) {
  for (std::size_t i = 0; i < statuses.size(); ++i) {
    INFO("worker " << i << " exit status " << statuses[i] << " (-1: killed at the deadline)");
    REQUIRE(statuses[i] == 0);
  }
}

}  // namespace

// args: url prefix name index ttl_ms poll_max_ms hold_ms out_file
// One fair acquire(wait); writes its grant after releasing.
DBLOCK_WORKER(queued_worker) {
  auto db = open_db(args.at(0), args.at(1), 3);
  db.ping();
  dblock::lease_options lo;
  lo.fair = true;
  lo.ttl = milliseconds(std::stoll(args.at(4)));
  lo.poll_max = milliseconds(std::stoll(args.at(5)));
  dblock::lease_lock lock(db, args.at(2), lo);
  grant g;
  g.proc = std::stoi(args.at(3));
  g.request_ns = monotonic_ns();
  auto guard = lock.acquire(std::chrono::seconds(60));
  g.enter_ns = monotonic_ns();
  g.fence = guard.fence();
  std::this_thread::sleep_for(milliseconds(std::stoll(args.at(6))));
  g.exit_ns = monotonic_ns();
  guard.release();
  write_file_atomic(args.at(7), format_grants({g}));
  return 0;
}

DBLOCK_TEST("fair hand-off: 6 staggered waiter processes are granted in arrival order",
            "[waiting][process]") {
  const int waiters = 6;
  temp_dir dir("wait");
  process_set ps;
  const std::string name = "order-" + dblock::test::random_suffix();
  dblock::lease_options ho;
  ho.fair = true;
  ho.ttl = std::chrono::seconds(60);  // held until every waiter is queued
  dblock::lease_lock holder(ctx.db, name, ho);
  auto h = holder.try_acquire();
  REQUIRE(h);
  const long long holder_fence = h->fence();
  for (int i = 0; i < waiters; ++i) {
    ps.spawn("queued_worker", {ctx.url, ctx.prefix, name, std::to_string(i), "5000", "200", "20",
                               dir.file("w" + std::to_string(i))});
    INFO("waiter " << i << " did not show up in the queue");
    REQUIRE(wait_for_waiters(ctx, name, i + 1, milliseconds(30000)));
  }
  h->release();
  require_success(ps.wait_all(milliseconds(120000)));
  const auto gs = collect(dir, waiters);
  REQUIRE(gs.size() == static_cast<std::size_t>(waiters));
  INFO("grant order: " << order_of(gs));
  for (int i = 0; i < waiters; ++i)
    CHECK(gs[i].proc == i);
  const std::string problem = exclusion_problem(gs);
  INFO(problem);
  CHECK(problem.empty());
  CHECK(gs.front().fence > holder_fence);
  CHECK(count_waiters(ctx, name) == 0);  // everyone left the queue
}

// ---- constant contention: workers that acquire again right after releasing ---------------------

namespace {

// Read n, sleep 0..2 ms, write n+1 in a fenced transaction: updates are lost unless the lease
// excludes the other clients.
void fenced_increment(dblock::database& db, dblock::lease_guard& g, const std::string& table,
                      std::mt19937_64& rng) {
  int n = -1;
  {
    auto c = db.connect();
    c.session() << "SELECT n FROM " << table << " WHERE id = 1", soci::into(n);
  }
  std::uniform_int_distribution<int> us(0, 2000);
  std::this_thread::sleep_for(std::chrono::microseconds(us(rng)));
  int next = n + 1;
  g.fenced([&](soci::session& sql) {
    sql << "UPDATE " << table << " SET n = :n WHERE id = 1", soci::use(next);
  });
}

}  // namespace

// args: url prefix name fair|unfair iterations hold_us table|- dir index
// Connects, reports ready (<dir>/ready<index>), waits for <dir>/go (a CLOCK_MONOTONIC start),
// then loops: acquire(wait), hold (sleep hold_us, or a fenced increment of `table`), release.
DBLOCK_WORKER(loop_worker) {
  auto db = open_db(args.at(0), args.at(1), 3);
  db.ping();
  dblock::lease_options lo;
  lo.fair = args.at(3) == "fair";
  lo.ttl = std::chrono::seconds(10);
  lo.poll_initial = milliseconds(1);
  lo.poll_max = milliseconds(20);  // MySQL polls: keep its hand-off latency even
  dblock::lease_lock lock(db, args.at(2), lo);
  const int iterations = std::stoi(args.at(4));
  const long long hold_us = std::stoll(args.at(5));
  const std::string table = args.at(6), dir = args.at(7), index = args.at(8);
  std::mt19937_64 rng(std::random_device{}());
  write_file_atomic(dir + "/ready" + index, "ready\n");
  if (!wait_for_file(dir + "/go", milliseconds(60000))) return 10;
  dblock::test::sleep_until_monotonic(std::stoll(read_file(dir + "/go")));
  std::vector<grant> out;
  for (int i = 0; i < iterations; ++i) {
    grant g;
    g.proc = std::stoi(index);
    g.request_ns = monotonic_ns();
    auto guard = lock.acquire(std::chrono::seconds(120));
    g.enter_ns = monotonic_ns();
    g.fence = guard.fence();
    if (table == "-")
      std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
    else
      fenced_increment(db, guard, table, rng);
    g.exit_ns = monotonic_ns();
    guard.release();
    out.push_back(g);
  }
  write_file_atomic(dir + "/w" + index, format_grants(out));
  return 0;
}

namespace {

// One snapshot of the waiter queue, taken between start_ns and end_ns.
struct snapshot {
  long long start_ns = 0, end_ns = 0;
  std::vector<std::pair<long long, int>> entries;  // (ticket, worker index), by ticket
};

struct loop_run {
  std::vector<grant> grants;        // in grant order
  std::vector<snapshot> snapshots;  // of the lock's queue while the workers ran
};

// Reads the live queue of `name` about every millisecond until `stop` (a failed read is
// skipped). Live as the acquire statement counts it: an entry whose waiter did not refresh it in
// time has expired and is passed by design (docs/waiting.md), which a loaded machine can cause;
// reading it as queued made a grant past it look like an overtaking (seen beside two CPU hogs,
// a build and two test runs).
std::vector<snapshot> sample_queue(const dblock::test::context& ctx, const std::string& name,
                                   const std::vector<int>& pids, const std::atomic<bool>& stop) {
  const std::string now = ctx.backend == "postgresql" ? "clock_timestamp()"
                          : ctx.backend == "mysql"
                              ? "UTC_TIMESTAMP(6)"
                              : "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
  std::vector<snapshot> out;
  while (!stop.load()) {
    try {
      auto c = ctx.db.connect();
      snapshot s;
      std::vector<long long> tickets(64), holders(64);
      s.start_ns = monotonic_ns();
      c.session() << "SELECT ticket, holder_pid FROM " << ctx.table("lock_waiter")
                  << " WHERE resource_name = :n AND expires_at > " << now << " ORDER BY ticket",
          soci::use(name), soci::into(tickets), soci::into(holders);
      s.end_ns = monotonic_ns();
      for (std::size_t i = 0; i < tickets.size(); ++i) {
        const auto it = std::find(pids.begin(), pids.end(), static_cast<int>(holders[i]));
        s.entries.emplace_back(tickets[i], static_cast<int>(it - pids.begin()));
      }
      out.push_back(std::move(s));
    } catch (const std::exception&) {
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  return out;
}

// Runs `procs` loop workers on a fresh lock from a common start, sampling its queue; checks
// exclusion and fences.
loop_run run_loop(const dblock::test::context& ctx, bool fair, int procs, int iterations,
                  long long hold_us, const std::string& table) {
  temp_dir dir("wait");
  process_set ps;
  const std::string name = "loop-" + dblock::test::random_suffix();
  std::vector<int> pids;
  for (int p = 0; p < procs; ++p)
    pids.push_back(ps.spawn("loop_worker", {ctx.url, ctx.prefix, name, fair ? "fair" : "unfair",
                                            std::to_string(iterations), std::to_string(hold_us),
                                            table, dir.path, std::to_string(p)}));
  for (int p = 0; p < procs; ++p)
    REQUIRE(wait_for_file(dir.file("ready" + std::to_string(p)), milliseconds(60000)));
  std::atomic<bool> stop{false};
  loop_run r;
  std::thread sampler([&] { r.snapshots = sample_queue(ctx, name, pids, stop); });
  write_file_atomic(dir.file("go"), std::to_string(monotonic_ns() + 50 * ns_per_ms));
  auto statuses = ps.wait_all(milliseconds(180000));
  stop.store(true);
  sampler.join();
  require_success(statuses);
  r.grants = collect(dir, procs);
  REQUIRE(r.grants.size() == static_cast<std::size_t>(procs * iterations));
  const std::string problem = exclusion_problem(r.grants);
  INFO(problem);
  CHECK(problem.empty());
  return r;
}

// FIFO by ticket, independent of timing: a grant must not overtake a waiter that a snapshot
// (taken after the grantee asked, before it got the lease) shows queued ahead of the grantee
// and that got no grant in between. A grant with no such snapshot (a failed read, a sampler
// descheduled for the whole wait, a grant taken without queueing) cannot be checked: `checked`
// counts those that were.
struct overtaking_check {
  std::string problem;  // the first overtaking found, or ""
  std::size_t checked = 0;
};

overtaking_check overtaking(const loop_run& r) {
  auto ticket_of = [](const snapshot& s, int proc) {
    for (const auto& e : s.entries)
      if (e.second == proc) return e.first;
    return -1LL;
  };
  overtaking_check out;
  for (const auto& g : r.grants) {
    const snapshot* last = nullptr;
    for (const auto& s : r.snapshots)
      if (s.start_ns > g.request_ns && s.end_ns < g.enter_ns && ticket_of(s, g.proc) >= 0)
        last = &s;
    if (!last) continue;
    ++out.checked;
    const long long mine = ticket_of(*last, g.proc);
    for (const auto& [ticket, q] : last->entries) {
      if (q == g.proc || ticket >= mine) continue;
      // Only a worker that waited through the whole read can be overtaken by its entry: where
      // the queue exit is deferred (MySQL/MariaDB), a holder's entry stays until its release,
      // and such an entry waits for nothing (the acquire leaves the owner's own entries out).
      // A worker that waited through the read had no other live entry (its last release made
      // sure the previous one was gone), and this wait's grant must come before g's.
      const auto wait = std::find_if(r.grants.begin(), r.grants.end(), [&](const grant& h) {
        return h.proc == q && h.request_ns <= last->start_ns && h.enter_ns >= last->end_ns;
      });
      if (wait == r.grants.end()) continue;
      const bool served = wait->enter_ns < g.enter_ns;
      if (!served && out.problem.empty())
        out.problem = "fence " + std::to_string(g.fence) + " went to worker " +
                      std::to_string(g.proc) + " (ticket " + std::to_string(mine) +
                      ") ahead of worker " + std::to_string(q) + " (ticket " +
                      std::to_string(ticket) + ")";
    }
  }
  return out;
}

}  // namespace

// The overtaking check on runs made up for it: a waiter overtaken is found, and a holder's entry
// left in the queue until its release (MySQL/MariaDB defer the queue exit) is not taken for a
// waiter (the soak of 2026-12-07 failed on that: "fence 41 went to worker 3 (ticket 40) ahead
// of worker 1 (ticket 39)", worker 1 holding fence 40 at the read).
TEST_CASE("overtaking check: a waiter passed is found, a holder's deferred entry is not",
          "[unit][waiting]") {
  auto run = [](long long q_enter) {
    loop_run r;
    // Worker 0 asks at 0 and gets fence 1 at q_enter; worker 1 asks at 5 and gets fence 2 at 20.
    grant q{0, 1, 0, q_enter, q_enter + 3}, g{1, 2, 5, 20, 23};
    r.grants = q_enter < 20 ? std::vector<grant>{q, g} : std::vector<grant>{g, q};
    // Read between 11 and 12, during worker 1's wait: both entries, worker 0's ahead.
    r.snapshots.push_back({11, 12, {{1, 0}, {2, 1}}});
    return overtaking(r);
  };
  const auto passed = run(30);  // worker 0 waited through the read and got its grant after 20
  CHECK_FALSE(passed.problem.empty());
  CHECK(run(15).problem.empty());  // worker 0 served after the read, before worker 1
  CHECK(run(10).problem.empty());  // worker 0 held at the read: its entry waited for nothing
}

namespace {

// The steady state [from, to): after two rounds and, with `all_started`, once every worker has
// had its first grant (a worker process that started late, on a loaded or instrumented build,
// is not yet contending), up to the first worker's last grant (then fewer workers contend).
std::pair<std::size_t, std::size_t> steady_range(const std::vector<grant>& gs, int procs,
                                                 bool all_started = true) {
  std::map<int, std::size_t> first, last;
  for (std::size_t i = 0; i < gs.size(); ++i) {
    first.emplace(gs[i].proc, i);
    last[gs[i].proc] = i;
  }
  std::size_t to = gs.size(), from = static_cast<std::size_t>(2 * procs);
  for (const auto& kv : last)
    to = std::min(to, kv.second + 1);
  if (all_started)
    for (const auto& kv : first)
      from = std::max(from, kv.second);
  return {std::min(to, from), to};
}

// Windows of `procs` consecutive grants within [from, to) in which some process is missing.
int window_violations(const std::vector<grant>& gs, int procs, std::size_t from, std::size_t to) {
  int bad = 0;
  for (std::size_t i = from; i + static_cast<std::size_t>(procs) <= to; ++i) {
    std::set<int> seen;
    for (int k = 0; k < procs; ++k)
      seen.insert(gs[i + static_cast<std::size_t>(k)].proc);
    if (static_cast<int>(seen.size()) != procs) ++bad;
  }
  return bad;
}

// Grants in [from, to) that went to the same process as the grant before.
int repeats(const std::vector<grant>& gs, std::size_t from, std::size_t to) {
  int n = 0;
  for (std::size_t i = std::max<std::size_t>(from, 1); i < to; ++i)
    if (gs[i].proc == gs[i - 1].proc) ++n;
  return n;
}

// The fair test's failure condition on the grant order, "" when it holds: in the steady state
// (steady_range, every worker started) most of the run, at most one window in 8 of `procs`
// consecutive grants missing a worker, at most one grant to the worker granted just before.
// Strict round-robin needs each releaser to re-queue before the next release, which a busy
// machine can delay past a short hold (SQLite's busy wait, a descheduled process): hence a few
// broken windows allowed, repeats almost never. The unfair control requires it to be broken.
std::string round_robin_breach(const std::vector<grant>& gs, int procs) {
  const auto [from, to] = steady_range(gs, procs);
  const std::string range = "steady state: grants [" + std::to_string(from) + ", " +
                            std::to_string(to) + ") of " + std::to_string(gs.size());
  if (to - from < gs.size() / 2) return range + ", less than half the run";
  const int windows = window_violations(gs, procs, from, to);
  if (windows > static_cast<int>((to - from) / 8))
    return range + ", " + std::to_string(windows) + " broken windows (at most " +
           std::to_string((to - from) / 8) + " allowed)";
  const int reps = repeats(gs, from, to);
  if (reps > 1) return range + ", " + std::to_string(reps) + " repeats (at most 1 allowed)";
  return "";
}

struct wait_figures {
  double mean_ns = 0, max_ns = 0;
  std::size_t counted = 0, stalled = 0;
};

// Waits (request to grant) in [from, to), leaving out those during which the lease stood still
// for over `stall_ns` (held that long, or that long between two grants): a process descheduled
// by load on this host, not the order of the queue.
wait_figures wait_stats(const std::vector<grant>& gs, std::size_t from, std::size_t to,
                        long long stall_ns) {
  wait_figures f;
  double sum = 0;
  for (std::size_t i = from; i < to; ++i) {
    bool stalled = false;
    for (std::size_t j = 1; j <= i; ++j)
      if (gs[j].enter_ns >= gs[i].request_ns && (gs[j].enter_ns - gs[j - 1].exit_ns > stall_ns ||
                                                 gs[j - 1].exit_ns - gs[j - 1].enter_ns > stall_ns))
        stalled = true;
    if (stalled) {
      ++f.stalled;
      continue;
    }
    const double w = static_cast<double>(gs[i].enter_ns - gs[i].request_ns);
    f.max_ns = std::max(f.max_ns, w);
    sum += w;
    ++f.counted;
  }
  f.mean_ns = f.counted ? sum / static_cast<double>(f.counted) : 0;
  return f;
}

}  // namespace

DBLOCK_TEST("constant contention, fair: strict round-robin among 4 processes",
            "[waiting][process]") {
  const int procs = 4, iterations = full_run() ? 100 : 15;
  // The queue order is checked exactly every time (overtaking, exclusion, fences). Strict
  // rotation and the share of grants the sampler saw depend on the machine's pace as well: each
  // releaser must ask again within the next holder's hold, and the sampler must run during most
  // waits. A run that missed only those runs again with twice and four times the hold.
  loop_run r;
  overtaking_check o;
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    r = run_loop(ctx, true, procs, iterations, 3000LL * scale, "-");
    const auto& gs = r.grants;
    INFO("grant order: " << order_of(gs) << "; " << r.snapshots.size() << " queue snapshots");
    // Grants follow the order in which the database queued the waiters (without timing), checked
    // on most grants: in a steady state every acquire queues, and the queue is read about every
    // millisecond of a wait of about three holds.
    o = overtaking(r);
    INFO(o.problem << "; " << o.checked << " of " << gs.size() << " grants checked for overtaking");
    CHECK(o.problem.empty());
    const bool seen = o.checked * 5 >= gs.size() * 4;
    const std::string breach = round_robin_breach(gs, procs);
    if (!last && (!seen || !breach.empty()))
      return {"hold " + std::to_string(3 * scale) + " ms: " + std::to_string(o.checked) + " of " +
              std::to_string(gs.size()) + " grants checked; " + breach};
    CHECK(seen);
    INFO(breach);
    CHECK(breach.empty());
    return {};
  });
  const auto& gs = r.grants;
  const auto [from, to] = steady_range(gs, procs);
  const auto w = wait_stats(gs, from, to, 50 * ns_per_ms);
  const double ratio = w.max_ns / w.mean_ns;
  WARN(ctx.backend << " fair waits in the steady state: mean " << w.mean_ns / 1e6 << " ms, max "
                   << w.max_ns / 1e6 << " ms, max/mean " << ratio << " (" << w.counted << " waits; "
                   << w.stalled << " left out, the lease stood still > 50 ms); " << o.checked
                   << " of " << gs.size() << " grants checked for overtaking");
  // (How many waits the figure counts depends on the machine's stalls, so it is not checked.)
  // max/mean is a speed figure: `dblock-bench` reports it (fairness_max_over_mean_wait). Here
  // it is only reported, since a loaded CI machine stretches single waits (3.6 was seen on
  // SQLite while the order above stayed exact). Starvation is what the order checks rule out.
}

namespace {

// The unfair control's run: the same workers, unfair, where a releaser that asks again at once
// takes the lease before the woken waiter gets to it, acted out rather than hoped for. Workers
// 1..procs-1 queue behind a holder of this test and are stopped (SIGSTOP): queued, they cannot
// try. The holder releases and worker 0 runs all its iterations, each re-acquire passing the
// queued waiters (what an unfair lock allows and a fair one refuses), then the others are
// continued (SIGCONT) and run theirs. Checks exclusion and fences; the grants in grant order.
std::vector<grant> run_barging(const dblock::test::context& ctx, int procs, int iterations) {
  temp_dir dir("wait");
  process_set ps;
  const std::string name = "barge-" + dblock::test::random_suffix();
  dblock::lease_options ho;
  ho.ttl = std::chrono::seconds(60);
  dblock::lease_lock holder(ctx.db, name, ho);
  auto h = holder.try_acquire();
  REQUIRE(h);
  auto spawn = [&](int p) {
    return ps.spawn("loop_worker", {ctx.url, ctx.prefix, name, "unfair", std::to_string(iterations),
                                    "3000", "-", dir.path, std::to_string(p)});
  };
  std::vector<int> queued;
  for (int p = 1; p < procs; ++p)
    queued.push_back(spawn(p));
  for (int p = 1; p < procs; ++p)
    REQUIRE(wait_for_file(dir.file("ready" + std::to_string(p)), milliseconds(60000)));
  write_file_atomic(dir.file("go"), std::to_string(monotonic_ns()));
  REQUIRE(wait_for_waiters(ctx, name, procs - 1, milliseconds(60000)));
  for (const int pid : queued)
    REQUIRE(::kill(pid, SIGSTOP) == 0);
  h->release();
  const int barger = spawn(0);  // finds "go" written: starts at once
  const int barger_status = ps.wait(barger, milliseconds(120000));
  for (const int pid : queued)
    ::kill(pid, SIGCONT);
  INFO("worker 0 exit status " << barger_status << " (-1: killed at the deadline)");
  REQUIRE(barger_status == 0);
  require_success(ps.wait_all(milliseconds(180000)));
  const auto gs = collect(dir, procs);
  REQUIRE(gs.size() == static_cast<std::size_t>(procs * iterations));
  const std::string problem = exclusion_problem(gs);
  INFO(problem);
  CHECK(problem.empty());
  return gs;
}

}  // namespace

// Negative control: the same load unfair, with the barging the fair lock rules out forced
// (run_barging): the fair test's condition on the order must be seen broken, at any speed.
DBLOCK_TEST("constant contention, unfair: the releaser barges (negative control)",
            "[waiting][process]") {
  const int procs = 4, iterations = full_run() ? 100 : 15;
  const auto gs = run_barging(ctx, procs, iterations);
  const std::string breach = round_robin_breach(gs, procs);
  WARN(ctx.backend << " unfair: " << (breach.empty() ? "round-robin held" : breach));
  INFO("grant order: " << order_of(gs));
  CHECK_FALSE(breach.empty());
}

// ---- exact counter with fenced writes -----------------------------------------------------------

namespace {

void counter_run(const dblock::test::context& ctx, bool fair) {
  const int procs = full_run() ? 16 : 8, iterations = full_run() ? 100 : 20;
  const std::string table = ctx.table("counter");
  ctx.exec("CREATE TABLE " + table + " (id INT PRIMARY KEY, n INT)");
  ctx.exec("INSERT INTO " + table + " (id, n) VALUES (1, 0)");
  const auto gs = run_loop(ctx, fair, procs, iterations, 0, table).grants;  // checks exclusion
  auto c = ctx.db.connect();
  int n = -1;
  c.session() << "SELECT n FROM " << table << " WHERE id = 1", soci::into(n);
  CHECK(n == procs * iterations);
  std::set<long long> fences;
  for (const auto& g : gs)
    fences.insert(g.fence);
  CHECK(fences.size() == gs.size());
}

}  // namespace

DBLOCK_TEST("counter: 8 (full run: 16) fair waiter processes, fenced increments exact",
            "[waiting][process]") {
  counter_run(ctx, true);
}

DBLOCK_TEST("counter: 8 (full run: 16) unfair waiter processes, fenced increments exact",
            "[waiting][process]") {
  counter_run(ctx, false);
}
