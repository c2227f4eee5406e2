// Scenario 6 (docs/safety.md T8, T9): clock jumps.
//
// Clients: worker processes run under libfaketime (LD_PRELOAD) with their wall clock at +1 h or
// -1 h, or running at double or half rate from their start. CLOCK_MONOTONIC is kept real in every
// variant (FAKETIME_DONT_FAKE_MONOTONIC=1), deliberately: (1) an NTP step or a skewed wall clock
// leaves it alone, and (2) libfaketime 0.9.10 cannot fake it usefully: with a rate ("+0 x2") its
// faked CLOCK_MONOTONIC returns realtime-scale values (~1.8e9 s) and it does not intercept
// pthread_cond_clockwait, so every std::condition_variable::wait_for (libstdc++ waits on an
// absolute CLOCK_MONOTONIC deadline) sleeps for decades; seen as a waiter hung in
// cancellation::sleep_for. So the guard's local validity (steady_clock) always runs at the real
// rate here; a drifting monotonic clock is not simulated. libfaketime does scale nanosleep
// (std::this_thread::sleep_for) by the rate. The workload's interval timestamps are read by a
// raw clock_gettime system call, which libfaketime cannot intercept.
//   - counter workload, 2 skewed + 2 real workers per variant: exact counts and fence order
//     (fault_support.hpp); on PostgreSQL/MariaDB also non-overlap of acknowledged sections and
//     no premature takeover (a grant of the next fence while the previous holder, which had held
//     for less than TTL/2, had not yet begun to release).
//   - takeover probes: a holder (no watchdog, alive but idle) and a waiter in separate processes
//     with different clocks; measured: time from the holder's acquire request to the waiter's
//     grant on the real monotonic clock; checked: the holder's fenced write afterwards is
//     refused (no stale write) and, on the servers, TTL <= takeover <= bound.
// SQLite has no server clock: expiry is judged by each process's own wall clock (documented in
// the README and docs/safety.md). Skew therefore breaks time-based exclusion there (a process ahead
// takes over unexpired leases at once; a process behind waits up to the skew; a row released by
// a process ahead used to stay unacquirable for the others, fixed, see the regression test at the
// end): the SQLite
// test demonstrates that limitation (its probes require the premature and the missing takeovers
// to happen) while still checking that fenced writes stay exact (S1 holds; S2 and L1 do not).
//
// Server: a throwaway PostgreSQL under libfaketime (scripts/test-servers.sh pg-faketime-setup)
// whose clock jumps +1 h and -1 h (and back) while the counter workload runs (checked: exactness,
// fence order, and some increment acknowledged within 2 x TTL after every jump, plus a slack at
// the machine's measured pace); then probes measure the takeover after a forward jump (before
// the TTL: the lease expires early, the stale holder's fenced write is refused) and after a
// backward jump (no takeover until the clock comes back, i.e. up to skew + TTL). A backward jump
// that fell between a release and the next acquire used to leave the lock unacquirable for up to
// the jump (fixed; regression test at the end).
#include <soci/soci.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "test_paths.hpp"

using namespace dblock::test::faults;

namespace {

struct clock_variant {
  const char* name;
  const char* faketime;  // FAKETIME value, "" for the real clock
};

const clock_variant real_clock{"real", ""};
const clock_variant plus_1h{"+1h", "+1h"};
const clock_variant minus_1h{"-1h", "-1h"};
const clock_variant double_rate{"x2", "+0 x2"};
const clock_variant half_rate{"x0.5", "+0 x0.5"};

std::vector<std::string> clock_env(const clock_variant& v) {
  if (!*v.faketime) return {};
  // CLOCK_MONOTONIC stays real (see the top of this file).
  return {"LD_PRELOAD=" + faketime_lib(), std::string("FAKETIME=") + v.faketime,
          "FAKETIME_DONT_FAKE_MONOTONIC=1", "DONT_FAKE_MONOTONIC=1"};
}

long long raw_realtime_ms() {
  timespec ts{};
  ::syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000LL + ts.tv_nsec / 1000000;
}

// This process's wall clock (maybe faked) minus the real one, in ms.
long long wall_skew_ms() {
  auto now =
      std::chrono::duration_cast<milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  return now - raw_realtime_ms();
}

bool raw_wait_file(const std::string& path, long long timeout_ms) {
  const long long deadline = raw_monotonic_ns() + timeout_ms * 1000000LL;
  while (::access(path.c_str(), F_OK) != 0) {
    if (raw_monotonic_ns() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// Grants (G) and release starts (r) of the counter workers' logs: the number of premature
// takeovers, i.e. fence f+1 granted while the holder of f, granted less than TTL/2 earlier, had
// not begun to release (only an early expiry can explain that).
long long premature_takeovers(const std::string& dir, int ttl_ms, std::string& example) {
  struct hold {
    long long g = 0, r = 0;
  };
  std::map<long long, hold> holds;
  for (int id = 0; id < 64; ++id) {
    std::istringstream in(read_file(dir + "/w" + std::to_string(id) + ".log"));
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream l(line);
      std::string k;
      long long f = 0, ns = 0;
      if (!(l >> k >> f >> ns)) continue;
      if (k == "G") holds[f].g = ns;
      if (k == "r") holds[f].r = ns;
    }
  }
  long long n = 0;
  const hold* prev = nullptr;
  long long prev_fence = 0;
  for (const auto& kv : holds) {
    if (kv.second.g == 0) continue;
    if (prev) {
      const long long g = kv.second.g;
      if ((prev->r == 0 || g < prev->r) && g - prev->g < ttl_ms * 1000000LL / 2) {
        if (n++ == 0)
          example = "fence " + std::to_string(kv.first) + " granted " +
                    std::to_string((g - prev->g) / 1000000) + " ms after fence " +
                    std::to_string(prev_fence) + ", before that holder began to release";
      }
    }
    prev = &kv.second;
    prev_fence = kv.first;
  }
  return n;
}

void reset_workload_tables(const context& ctx) {
  ctx.exec("DELETE FROM " + ctx.table("items"));
  ctx.exec("UPDATE " + ctx.table("counter") + " SET n = 0 WHERE id = 1");
}

// True when every pid has exited (a zombie or gone), without reaping it.
bool all_exited(const std::vector<int>& pids) {
  for (int pid : pids) {
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    auto p = stat.rfind(')');
    if (p != std::string::npos && p + 2 < stat.size() && stat[p + 2] != 'Z') return false;
  }
  return true;
}

struct skew_result {
  analysis a;
  long long premature = 0;
  long long stuck_workers = 0;  // SQLite: workers still waiting for a released row 2 s after stop
  std::string example;
};

// 4 counter workers for `ms`: 0 and 2 under `v`, 1 and 3 on the real clock.
skew_result run_skewed_counter(context& ctx, const clock_variant& v, int ms, int ttl_ms) {
  reset_workload_tables(ctx);
  temp_dir dir("faults-skew");
  auto w = make_workload(ctx, "skew", dir, ttl_ms);
  w.work_ms = 2;
  process_set ps;
  std::vector<int> pids;
  for (int i = 0; i < 4; ++i)
    pids.push_back(
        spawn_counter_worker(ps, w, i, i % 2 == 0 ? clock_env(v) : std::vector<std::string>{}));
  std::this_thread::sleep_for(milliseconds(ms));
  // Workers under libfaketime (and ASan) start slowly on a loaded machine: the window may pass
  // before any of them wrote. More time then, not a failed "acked > 0".
  wait_for_progress([&] { return log_lines(w, 0, 4, "K") > 0; }, std::chrono::seconds(60));
  stop_workers(w);
  skew_result r;
  if (ctx.backend == "sqlite") {
    // A row released by a process whose clock is ahead carries expires_at in the future of the
    // others; acquire used to take only expired rows (fixed: released rows are free, see the
    // regression test below). Should workers still not finish within 2 s, expire the released
    // rows so that they can, and count them as stuck (reported).
    const long long deadline = monotonic_ns() + 2000000000LL;
    while (!all_exited(pids) && monotonic_ns() < deadline)
      std::this_thread::sleep_for(milliseconds(10));
    if (!all_exited(pids)) {
      for (int pid : pids)
        if (!all_exited({pid})) ++r.stuck_workers;
      // Released rows are free: expire them on every clock (hold_count = 0 only).
      ctx.exec("UPDATE " + ctx.db.lock_table() + " SET expires_at = 0 WHERE hold_count = 0");
    }
  }
  auto st = ps.wait_all(std::chrono::seconds(90));
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("variant " << v.name << ": worker " << i << " exit status " << st[i]);
    CHECK(st[i] == 0);
  }
  r.a = analyze(ctx.db, ctx, w, ctx.backend != "sqlite");
  r.premature = premature_takeovers(dir.path, ttl_ms, r.example);
  return r;
}

}  // namespace

// ---- probes: one holder, one waiter, different clocks ----------------------------------------

// args: url prefix lock ttl_ms dir. Acquires (no watchdog), writes <dir>/holder "fence sent_ns
// got_ns wall_skew_ms", waits (idle, like a paused holder) for <dir>/go, then writes
// <dir>/holder_done "valid(0|1) outcome" where outcome is "ok" (its fenced write committed) or
// the error code of the refusal.
DBLOCK_WORKER(clock_probe_holder) {
  const std::string url = args.at(0), prefix = args.at(1), name = args.at(2), dir = args.at(4);
  const int ttl_ms = std::stoi(args.at(3));
  auto db = open_db(url, prefix, 2);
  lease_options lo;
  lo.ttl = milliseconds(ttl_ms);
  lease_lock lock(db, name, lo);
  std::optional<lease_guard> g;
  long long sent = 0;
  for (int i = 0; i < 1000 && !g; ++i) {
    sent = raw_monotonic_ns();
    g = lock.try_acquire();
    if (!g) std::this_thread::sleep_for(milliseconds(5));
  }
  if (!g) return 10;
  const long long got = raw_monotonic_ns();
  write_file_atomic(dir + "/holder", std::to_string(g->fence()) + " " + std::to_string(sent) + " " +
                                         std::to_string(got) + " " +
                                         std::to_string(wall_skew_ms()) + "\n");
  if (!raw_wait_file(dir + "/go", 120000)) return 11;
  const bool valid = g->valid();
  std::string outcome = "ok";
  try {
    g->fenced([&](soci::session& sql) {
      sql << "UPDATE " << prefix << "counter SET n = n + 1 WHERE id = 1";
    });
  } catch (const dblock::error& e) {
    outcome = dblock::to_string(e.kind());
  }
  write_file_atomic(dir + "/holder_done", std::string(valid ? "1 " : "0 ") + outcome + "\n");
  try {
    g->release();
  } catch (const std::exception&) {
  }
  return 0;
}

// args: url prefix lock ttl_ms wait_ms dir. acquire(wait_ms) (polls capped at 50 ms), writes
// <dir>/waiter "got <fence> <got_ns> <wall_skew_ms> <asked_ns> <round_trip_us>", "timeout
// <wall_skew_ms>" or "error <code>": asked_ns is when it began to wait (after its connection was
// made), round_trip_us the median of 9 plain round trips (ping) just before, the machine's pace.
DBLOCK_WORKER(clock_probe_waiter) {
  const std::string url = args.at(0), prefix = args.at(1), name = args.at(2), dir = args.at(5);
  auto db = open_db(url, prefix, 2);
  const long long round_trip_us = median_round_trip_us(db);
  const auto lo = polling_lease(milliseconds(std::stoi(args.at(3))), milliseconds(50));
  lease_lock lock(db, name, lo);
  std::string out;
  try {
    const long long asked = raw_monotonic_ns();
    auto g = lock.acquire(milliseconds(std::stoi(args.at(4))));
    out = "got " + std::to_string(g.fence()) + " " + std::to_string(raw_monotonic_ns()) + " " +
          std::to_string(wall_skew_ms()) + " " + std::to_string(asked) + " " +
          std::to_string(round_trip_us);
    g.release();
  } catch (const dblock::error& e) {
    out = e.code() == errc::timeout ? "timeout " + std::to_string(wall_skew_ms())
                                    : "error " + std::string(dblock::to_string(e.kind()));
  }
  write_file_atomic(dir + "/waiter", out + "\n");
  return 0;
}

namespace {

struct probe {
  const char* name;
  clock_variant holder, waiter;
  // SQLite only (its clock is the process's): the expected outcome, "premature" (taken over
  // before TTL), "none" (no takeover within 3 x TTL) or "" (depends on the drift so far).
  const char* sqlite_expect;
};

const probe probes[] = {
    {"holder+1h", plus_1h, real_clock, "none"},
    {"holder-1h", minus_1h, real_clock, "premature"},
    {"waiter+1h", real_clock, plus_1h, "premature"},
    {"waiter-1h", real_clock, minus_1h, "none"},
    {"holder-x2/waiter-x0.5", double_rate, half_rate, ""},
    {"holder-x0.5/waiter-x2", half_rate, double_rate, ""},
};

struct probe_result {
  bool took_over = false;
  long long takeover_ms = -1;  // from the holder's request to the waiter's grant
  // From the later of the lease's end (the holder's reply + TTL) and the waiter's first request
  // to its grant: the waiter's own delay, without the time its process took to start.
  long long late_ms = -1;
  long long round_trip_us = 0;  // the waiter's median plain round trip
  long long holder_skew_ms = 0, waiter_skew_ms = 0;
  bool holder_valid_after = false;
  std::string holder_outcome, waiter_line;
};

probe_result run_probe(const context& ctx, const probe& p, int ttl_ms) {
  temp_dir dir("faults-clkprobe");
  const std::string lock = "probe-" + random_suffix();
  process_set ps;
  int h =
      ps.spawn("clock_probe_holder", {ctx.url, ctx.prefix, lock, std::to_string(ttl_ms), dir.path},
               clock_env(p.holder));
  REQUIRE(wait_for_file(dir.file("holder"), std::chrono::seconds(30)));
  int w = ps.spawn(
      "clock_probe_waiter",
      {ctx.url, ctx.prefix, lock, std::to_string(ttl_ms), std::to_string(3 * ttl_ms), dir.path},
      clock_env(p.waiter));
  CHECK(ps.wait(w, std::chrono::seconds(60)) == 0);
  write_file_atomic(dir.file("go"), "go\n");
  CHECK(ps.wait(h, std::chrono::seconds(60)) == 0);
  probe_result r;
  long long fence = 0, sent = 0, got = 0;
  std::istringstream(read_file(dir.file("holder"))) >> fence >> sent >> got >> r.holder_skew_ms;
  r.waiter_line = read_file(dir.file("waiter"));
  std::istringstream wl(r.waiter_line);
  std::string k;
  wl >> k;
  if (k == "got") {
    long long wf = 0, wgot = 0, wasked = 0;
    wl >> wf >> wgot >> r.waiter_skew_ms >> wasked >> r.round_trip_us;
    r.took_over = true;
    r.takeover_ms = (wgot - sent) / 1000000;
    r.late_ms = (wgot - std::max(got + ttl_ms * 1000000LL, wasked)) / 1000000;
  } else if (k == "timeout") {
    wl >> r.waiter_skew_ms;
  }
  std::istringstream hd(read_file(dir.file("holder_done")));
  int valid = 0;
  hd >> valid >> r.holder_outcome;
  r.holder_valid_after = valid == 1;
  return r;
}

std::string describe(const probe& p, const probe_result& r) {
  std::ostringstream o;
  o << p.name << ":" << (r.took_over ? std::to_string(r.takeover_ms) + "ms" : "none")
    << "(skew h=" << r.holder_skew_ms << " w=" << r.waiter_skew_ms
    << ",stale_valid=" << (r.holder_valid_after ? 1 : 0) << ",fenced=" << r.holder_outcome << ")";
  return o.str();
}

}  // namespace

DBLOCK_TEST_SERVERS("client clocks at +-1 h and x2 / x0.5: fenced counter exact, no early takeover",
                    "[faults][clock]") {
  REQUIRE(!faketime_lib().empty());
  const int ms = count(2000, 15000), ttl_ms = 1000;
  create_workload_tables(ctx);
  long long violations = 0, trials = 0;
  std::string extra;
  for (const auto* v : {&plus_1h, &minus_1h, &double_rate, &half_rate}) {
    auto r = run_skewed_counter(ctx, *v, ms, ttl_ms);
    INFO("variant " << v->name << ": " << r.a.summary() << "\npremature takeovers " << r.premature
                    << " " << r.example);
    CHECK(r.a.violations == 0);
    CHECK(r.premature == 0);
    CHECK(r.a.acked > 0);
    violations += r.a.violations + r.premature;
    ++trials;
    extra += std::string(" ") + v->name + ":acked=" + std::to_string(r.a.acked) +
             ",lost=" + std::to_string(r.a.lost);
  }
  report("6-client-clock-skew", ctx.backend, trials, trials, violations, "variants" + extra);
}

DBLOCK_TEST_SERVERS(
    "client clocks skewed: takeover after TTL on the database clock, stale write refused",
    "[faults][clock]") {
  REQUIRE(!faketime_lib().empty());
  const int ttl_ms = 800, rounds = count(1, 5);
  create_workload_tables(ctx);
  long long trials = 0, violations = 0;
  std::string extra;
  for (int round = 0; round < rounds; ++round) {
    for (const auto& p : probes) {
      auto r = run_probe(ctx, p, ttl_ms);
      // Never before the TTL (a safety property, at any speed); after it, within one poll and
      // a slack that scales with the waiter's measured round trip (liveness: the waiter's own
      // delay, counted from when the lease ended or, if later, when the waiter began to wait,
      // since a loaded machine can take longer than the TTL to start a process).
      const long long bound = liveness_bound_ms(50, r.round_trip_us);
      INFO(describe(p, r) << " late " << r.late_ms << " ms, bound " << bound << " ms (round trip "
                          << r.round_trip_us << " us); waiter: " << r.waiter_line);
      ++trials;
      bool ok = r.took_over && r.takeover_ms >= ttl_ms && r.late_ms <= bound &&
                r.holder_outcome == "lease_lost";
      CHECK(r.took_over);
      CHECK(r.takeover_ms >= ttl_ms);
      CHECK(r.late_ms <= bound);
      CHECK(r.holder_outcome == "lease_lost");
      if (!ok) ++violations;
      if (round == 0) extra += " " + describe(p, r);
    }
  }
  report("6-client-skew-takeover", ctx.backend, trials, trials, violations, "probes=" + extra);
}

// SQLite: the documented limitation, demonstrated. The lock clock is each process's own, so skew
// between processes breaks time-based exclusion; fenced writes still never go stale.
DBLOCK_TEST_ONLY("sqlite",
                 "SQLite LIMITATION: client clock skew breaks time-based exclusion, fences hold",
                 "[faults][clock][limitation]") {
  REQUIRE(!faketime_lib().empty());
  const int ms = count(2000, 15000), ttl_ms = 1000, probe_ttl_ms = 800, rounds = count(1, 5);
  create_workload_tables(ctx);
  long long trials = 0, s1_violations = 0, time_violations = 0;
  std::string extra;
  for (const auto* v : {&plus_1h, &minus_1h, &double_rate, &half_rate}) {
    auto r = run_skewed_counter(ctx, *v, ms, ttl_ms);
    INFO("variant " << v->name << ": " << r.a.summary() << "\npremature takeovers " << r.premature
                    << " " << r.example);
    // S1 (fenced exclusion, exact counts, fence order) holds ...
    CHECK(r.a.violations == 0);
    CHECK(r.a.acked > 0);
    // ... S2 and L1 do not: processes ahead take over unexpired leases at once (rare here: the
    // real-clock workers are soon locked out, see stuck_workers; the probes below show it
    // deterministically).
    s1_violations += r.a.violations;
    time_violations += r.premature + r.stuck_workers;
    ++trials;
    extra += std::string(" ") + v->name + ":premature=" + std::to_string(r.premature) +
             ",stuck_workers=" + std::to_string(r.stuck_workers);
  }
  for (int round = 0; round < rounds; ++round) {
    for (const auto& p : probes) {
      const std::string expect = p.sqlite_expect;
      // Where a premature takeover is expected, the holder's lease lasts 20 s of real time: a
      // takeover is then before the TTL however long the waiter's process took to start (with
      // 800 ms, a slow start made the expected failure look like a timely takeover).
      const int ttl = expect == "premature" ? 20000 : probe_ttl_ms;
      auto r = run_probe(ctx, p, ttl);
      INFO(describe(p, r) << "; TTL " << ttl << " ms; waiter: " << r.waiter_line);
      ++trials;
      CHECK(r.holder_outcome == "lease_lost");  // S1: the stale holder never writes
      if (r.holder_outcome != "lease_lost") ++s1_violations;
      const bool premature = r.took_over && r.takeover_ms < ttl;
      if (expect == "premature") CHECK(premature);
      if (expect == "none") CHECK(!r.took_over);
      if (premature || !r.took_over) ++time_violations;
      if (round == 0) extra += " " + describe(p, r);
    }
  }
  // violations counts only S1 (the property this suite promises); the time-based failures are
  // the documented limitation and are listed separately.
  report("6-client-skew-sqlite-LIMITATION", ctx.backend, trials, trials, s1_violations,
         "time_based_failures=" + std::to_string(time_violations) + " (expected>0)" + extra);
}

// ---- the PostgreSQL server's clock jumps ----------------------------------------------------

namespace {

std::string script_path() {
  return std::string(DBLOCK_SOURCE_DIR) + "/scripts/test-servers.sh";
}

// A throwaway PostgreSQL under libfaketime; its clock offset is the content of a file that
// set() rewrites atomically (read by the server on every clock call). url is empty when the
// server could not be started (setup.log says why).
struct faketime_pg {
  std::string base, ts, srv, url, setup_log;
  faketime_pg() {
    char tmpl[] = "/tmp/dblock-ftpg-XXXXXX";
    if (!::mkdtemp(tmpl)) return;
    base = tmpl;
    ::chmod(base.c_str(), 0755);  // the server runs as user postgres when we are root
    ts = base + "/offset";
    srv = base + "/srv";
    setup_log = base + "/setup.log";
    set("+0");
    const std::string cmd =
        script_path() + " pg-faketime-setup " + srv + " " + ts + " 2>" + setup_log;
    std::string out;
    if (FILE* f = ::popen(cmd.c_str(), "r")) {
      char buf[512];
      while (std::fgets(buf, sizeof buf, f))
        out += buf;
      ::pclose(f);
    }
    const std::string key = "DBLOCK_TEST_FAKETIME_PG_URL='";
    auto p = out.find(key);
    if (p != std::string::npos) {
      auto e = out.find('\'', p + key.size());
      if (e != std::string::npos) url = out.substr(p + key.size(), e - p - key.size());
    }
  }
  faketime_pg(const faketime_pg&) = delete;
  faketime_pg& operator=(const faketime_pg&) = delete;
  void set(const std::string& offset) const {
    const std::string tmp = ts + ".tmp";
    {
      std::ofstream o(tmp);
      o << offset << "\n";
    }
    ::chmod(tmp.c_str(), 0644);
    std::rename(tmp.c_str(), ts.c_str());
  }
  ~faketime_pg() {
    if (base.empty()) return;
    [[maybe_unused]] int rc =
        std::system((script_path() + " stop " + srv + " >/dev/null 2>&1").c_str());
    ::unlink(ts.c_str());
    ::unlink(setup_log.c_str());
    ::rmdir(base.c_str());
  }
};

// The server's clock_timestamp() minus the real wall clock, in ms.
long long server_skew_ms(const database& db) {
  auto c = db.connect();
  long long us = 0;
  c.session() << "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000000 AS BIGINT)",
      soci::into(us);
  return us / 1000 - raw_realtime_ms();
}

}  // namespace

DBLOCK_TEST_ONLY("postgresql",
                 "PostgreSQL server clock jumps +-1 h mid-run: fences exact, takeover documented",
                 "[faults][clock][serial]") {
  REQUIRE(!faketime_lib().empty());
  faketime_pg srv;
  INFO("pg-faketime-setup: " << read_file(srv.setup_log));
  REQUIRE(!srv.url.empty());
  context f = ctx;  // the same table prefix on the faketime server
  f.url = srv.url;
  f.db = open_db(srv.url, ctx.prefix, 4);
  dblock::migrate(f.db);
  // The server's clock follows the file.
  srv.set("+1h");
  std::this_thread::sleep_for(milliseconds(20));
  const long long skew_plus = server_skew_ms(f.db);
  srv.set("+0");
  std::this_thread::sleep_for(milliseconds(20));
  const long long skew_zero = server_skew_ms(f.db);
  INFO("server skew at +1h: " << skew_plus << " ms, at +0: " << skew_zero << " ms");
  REQUIRE(std::llabs(skew_plus - 3600000) < 5000);
  REQUIRE(std::llabs(skew_zero) < 5000);

  // Phase 1: the counter workload while the clock jumps +1 h, back, -1 h, back, ...
  const int ttl_ms = 1000, jumps = count(4, 16);
  create_workload_tables(f);
  temp_dir dir("faults-srvclock");
  auto w = make_workload(srv.url, f.prefix, "jump", dir, ttl_ms);
  w.work_ms = 2;
  process_set ps;
  for (int i = 0; i < 4; ++i)
    spawn_counter_worker(ps, w, i);
  std::this_thread::sleep_for(milliseconds(1000));
  const char* offsets[] = {"+1h", "+0", "-1h", "+0"};
  std::vector<long long> jump_ns;
  // Each jump's bound on the first acknowledgement after it: 2 x TTL (the leases the jump ended,
  // or kept, and a poll) plus a slack at the pace measured right after it (liveness: a loaded
  // machine is slower at everything, the workers included).
  std::vector<long long> bounds;
  for (int j = 0; j < jumps; ++j) {
    std::this_thread::sleep_for(milliseconds(rnd(800, 1500)));
    srv.set(offsets[j % 4]);
    jump_ns.push_back(monotonic_ns());
    bounds.push_back(liveness_bound_ms(2 * ttl_ms, median_round_trip_us(f.db)));
  }
  // The workers run on until someone acknowledged a write after the last jump (at most a minute
  // more on a slow machine), so that its first acknowledgement is seen however late; how late is
  // judged by its bound below.
  const long long acked_at_last_jump = log_lines(w, 0, 4, "K");
  std::this_thread::sleep_for(milliseconds(1500));
  wait_for_progress([&] { return log_lines(w, 0, 4, "K") > acked_at_last_jump; },
                    std::chrono::seconds(60));
  stop_workers(w);
  require_clean_exit(ps, w, std::chrono::seconds(90));
  // No overlap check: a jump of the server's clock by an hour ends every lease at once, while
  // their holders' local validity (measured on their own clocks) still runs: sections overlap
  // by design. The fences (a stale holder's write is refused) and exact counts are promised.
  auto a = analyze(f.db, f, w, false);
  std::string example;
  const long long premature = premature_takeovers(dir.path, ttl_ms, example);
  long long stalled = 0;  // jumps after which nobody acknowledged within the bound
  std::string progress;
  for (std::size_t j = 0; j < jump_ns.size(); ++j) {
    const long long t = jump_ns[j];
    auto it = std::upper_bound(a.ack_exit_ns.begin(), a.ack_exit_ns.end(), t);
    long long ms = it == a.ack_exit_ns.end() ? -1 : (*it - t) / 1000000;
    progress += " " + std::to_string(ms) + "ms(bound " + std::to_string(bounds[j]) + ")";
    if (ms < 0 || ms > bounds[j]) ++stalled;
  }
  INFO(a.summary() << "\npremature takeovers (time-based, documented) " << premature << " "
                   << example << "\nfirst ack after each jump:" << progress);
  CHECK(a.violations == 0);
  CHECK(a.acked > 0);
  CHECK(stalled == 0);

  // Phase 2: takeover probes (clients on the real clock, in this process).
  auto db1 = open_db(srv.url, f.prefix, 2), db2 = open_db(srv.url, f.prefix, 2);
  auto fenced_outcome = [&](lease_guard& g) {
    try {
      g.fenced([&](soci::session& sql) {
        sql << "UPDATE " << f.table("counter") << " SET n = n + 1 WHERE id = 1";
      });
      return std::string("ok");
    } catch (const dblock::error& e) {
      return std::string(dblock::to_string(e.kind()));
    }
  };
  const int rounds = count(1, 5);
  long long stale = 0, fwd_early = 0, bwd_blocked = 0;
  std::string takeovers;
  for (int round = 0; round < rounds; ++round) {
    // Forward jump while a live (idle) holder has most of its TTL left: its lease expires at
    // once. The documented effect is the takeover before the TTL, which only the jump explains;
    // with a TTL of 30 s (3 s before) a slow machine cannot make a timely takeover look like it,
    // or the early one miss it, so the check is about the clock, not the pace. The waiter waits
    // less than the TTL: a grant at all is the early expiry.
    {
      srv.set("+0");
      const int fwd_ttl_ms = 30000;
      lease_options lo;
      lo.ttl = milliseconds(fwd_ttl_ms);
      lo.poll_max = milliseconds(50);
      const std::string name = "fwd-" + random_suffix();
      lease_lock hl(db1, name, lo), wl(db2, name, lo);
      const long long t0 = raw_monotonic_ns();
      auto g = hl.try_acquire();
      REQUIRE(g);
      srv.set("+1h");
      std::optional<lease_guard> wg;
      const auto waited = code_of([&] { wg = wl.acquire(milliseconds(fwd_ttl_ms * 2 / 3)); });
      const long long ms = (raw_monotonic_ns() - t0) / 1000000;
      const std::string outcome = fenced_outcome(*g);
      INFO("forward jump: " << (wg ? "taken over" : "no takeover") << " after " << ms
                            << " ms; stale holder's fenced: " << outcome);
      CHECK(!waited);
      CHECK(outcome == "lease_lost");
      CHECK(ms < fwd_ttl_ms);  // the documented effect: expiry comes early by the jump
      if (outcome != "lease_lost") ++stale;
      if (wg && ms < fwd_ttl_ms) ++fwd_early;
      if (wg) wg->release();
      srv.set("+0");
      takeovers += " fwd:" + std::to_string(ms) + "ms(ttl=" + std::to_string(fwd_ttl_ms) + ")";
    }
    // Backward jump while a live (idle) holder has 1 s left: no takeover until the clock
    // returns (it would take 1 h + TTL).
    {
      lease_options lo;
      lo.ttl = milliseconds(ttl_ms);
      lo.poll_max = milliseconds(50);
      const std::string name = "bwd-" + random_suffix();
      lease_lock hl(db1, name, lo), wl(db2, name, lo);
      const long long t0 = raw_monotonic_ns();
      auto g = hl.try_acquire();
      REQUIRE(g);
      srv.set("-1h");
      auto first = code_of([&] { auto wg = wl.acquire(milliseconds(3 * ttl_ms)); });
      const long long blocked_ms = (raw_monotonic_ns() - t0) / 1000000;
      srv.set("+0");
      auto wg = wl.acquire(milliseconds(3 * ttl_ms));
      const long long ms = (raw_monotonic_ns() - t0) / 1000000;
      const std::string outcome = fenced_outcome(*g);
      INFO("backward jump: no takeover for " << blocked_ms << " ms, taken over " << ms
                                             << " ms after the acquire once the clock was back; "
                                                "stale holder's fenced: "
                                             << outcome);
      CHECK(first == errc::timeout);
      CHECK(outcome == "lease_lost");
      if (outcome != "lease_lost") ++stale;
      if (first == errc::timeout) ++bwd_blocked;
      wg.release();
      takeovers += " bwd:none-for-" + std::to_string(blocked_ms) + "ms,then-" + std::to_string(ms) +
                   "ms-after-clock-back(ttl=" + std::to_string(ttl_ms) + ")";
    }
  }
  report("6-server-clock-jump", "postgresql", jumps + 2 * rounds, jumps + 2 * rounds,
         a.violations + stalled + stale,
         "acked=" + std::to_string(a.acked) + " lease_lost=" + std::to_string(a.lost) +
             " premature_takeovers=" + std::to_string(premature) + " fwd_early=" +
             std::to_string(fwd_early) + " bwd_blocked=" + std::to_string(bwd_blocked) +
             " first_ack_after_jump:" + progress + " probes:" + takeovers);
}

namespace {

struct contention_counter final : listener {
  std::atomic<long long> contended_calls{0};
  void contended(std::string_view) override { ++contended_calls; }
};

}  // namespace

// Found by scenario 6 (SQLite skew runs): release sets expires_at = now (the releaser's clock)
// and leaves hold_count = 0; acquire's read treats hold_count = 0 as free, but the upsert takes a
// row only when expires_at <= now (or the owner token is ours). When the clock then reads
// earlier than the release time (a PostgreSQL/MariaDB server clock stepped back; on SQLite any
// process whose clock is behind the releaser's), a released lease cannot be acquired until the
// clock passes the release time again (up to the size of the step), and acquire(wait) spins:
// read says free, the upsert fails, no sleep in between. Expected: a released lease is free
// whatever the clock says, and acquire(wait) never polls without sleeping. Fixed: the acquire
// statement takes rows with hold_count 0 on every backend; this is its regression test.
DBLOCK_TEST_ONLY("postgresql", "a released lease is acquirable after the server clock steps back",
                 "[faults][clock][serial]") {
  REQUIRE(!faketime_lib().empty());
  faketime_pg srv;
  INFO("pg-faketime-setup: " << read_file(srv.setup_log));
  REQUIRE(!srv.url.empty());
  auto events = std::make_shared<contention_counter>();
  database_options o = with_prefix(ctx.prefix);
  o.events = events;
  database db1 = open_db(srv.url, ctx.prefix, 2), db2(srv.url, o);
  dblock::migrate(db1);
  lease_options lo;
  lo.ttl = milliseconds(1000);
  lo.poll_max = milliseconds(50);
  const std::string name = "released-" + random_suffix();
  lease_lock a(db1, name, lo), b(db2, name, lo);
  {
    auto g = a.try_acquire();
    REQUIRE(g);
    g->release();
  }
  srv.set("-1h");
  const long long t0 = monotonic_ns();
  auto first = b.try_acquire();
  auto waited = code_of([&] { auto g = b.acquire(milliseconds(2000)); });
  const long long ms = (monotonic_ns() - t0) / 1000000;
  srv.set("+0");
  INFO("after the step back: try_acquire "
       << (first ? "acquired" : "not acquired") << "; acquire(2 s) "
       << (waited ? dblock::to_string(*waited) : "acquired") << " after " << ms << " ms with "
       << events->contended_calls.load()
       << " contended attempts (polls capped at 50 ms: <= ~40 "
          "expected)");
  CHECK(first.has_value());
  CHECK(!waited);
  CHECK(events->contended_calls.load() < 200);
}
