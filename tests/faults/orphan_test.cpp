// Scenario 7 (docs/safety.md T12, L2): an interrupt storm on acquirers. Four worker processes run
// the fenced counter workload with watchdog-renewed leases; each has two threads waiting in
// acquire(wait) on the same lock and a canceller thread that cancels the second thread's waits
// at random moments (5-80 ms). The parent sends SIGINT or SIGTERM to a worker, preferably while
// its main thread is inside acquire(), and starts a replacement. Half the workers handle the
// signals (a sigwait thread cancels every wait through dblock::cancellation, the threads end and
// the process exits 0, its guards released); the other half keep the default action (the process
// dies at once, maybe with a lease granted or an upsert in flight).
// After the storm the survivors stop acquiring but stay alive; 3 x TTL after the last interrupt
// the lock table must hold no lease (hold_count > 0 and expires_at in the future on the database
// clock), and one TTL later no row's expires_at may have moved (nobody renews anything). Also:
// handling workers exit 0 (their cancelled waits end), default-action workers die of the
// signal, and the counter workload's exactness and fence checks hold.
// Negative control: a guard with a running watchdog kept alive by this process (a leaked
// renewing lease) must be caught by the same check.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <soci/soci.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "fault_support.hpp"
#include "harness.hpp"
#include "workload_lock.hpp"

using namespace dblock::test::faults;

namespace {

// Worker slot states (shared with the parent).
constexpr long long slot_running = 3, slot_in_acquire = 1, slot_holding = 2;

struct append_log {
  int fd = -1;
  explicit append_log(const std::string& path) {
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
  }
  ~append_log() {
    if (fd >= 0) ::close(fd);
  }
  void line(const std::string& s) {
    std::string l = s + "\n";
    [[maybe_unused]] ssize_t w = ::write(fd, l.data(), l.size());
  }
};

}  // namespace

// args: url prefix lock ttl_ms dir id handle(0|1) kind (workload_lock: lease, semaphore, election)
// Logs as fault_counter_worker ("G", "A", "K", "L", "X", "r", "E") plus "C" for a cancelled
// wait and "S <signal>" when a handled signal arrived. Writes <dir>/idle<id> once it stops
// acquiring (after <dir>/stop) and exits when <dir>/exit appears.
DBLOCK_WORKER(orphan_worker) {
  const std::string url = args.at(0), prefix = args.at(1), name = args.at(2), dir = args.at(4);
  const int ttl_ms = std::stoi(args.at(3)), id = std::stoi(args.at(5));
  const bool handle = args.at(6) == "1";
  const std::string kind = args.at(7);
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  if (handle) {
    // Before any thread exists, so that every thread (dblock's included) inherits the mask and
    // only the sigwait thread below sees the signals.
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  } else {
    // The default action, whatever the test runner's shell left us (background jobs ignore
    // SIGINT).
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    pthread_sigmask(SIG_UNBLOCK, &sigs, nullptr);
  }
  append_log log(dir + "/w" + std::to_string(id) + ".log");
  shared_slots slots(dir + "/slots", 64, false);
  auto set_slot = [&](long long v) { __atomic_store_n(&slots.v[id], v, __ATOMIC_SEQ_CST); };
  const std::string counter = prefix + "counter", items = prefix + "items";
  const std::string stop = dir + "/stop", exit_file = dir + "/exit";
  auto db = open_db(url, prefix, 6);

  std::atomic<bool> stop_all{false};
  std::mutex mu;
  std::map<int, cancellation> current;  // thread index -> cancellation of its current wait
  auto cancel_all = [&] {
    std::lock_guard<std::mutex> l(mu);
    for (auto& kv : current)
      kv.second.cancel();
  };
  std::thread signal_thread;
  std::atomic<bool> done{false};
  if (handle) {
    signal_thread = std::thread([&] {
      const timespec tick{0, 20000000};
      while (!done.load()) {
        int sig = sigtimedwait(&sigs, nullptr, &tick);
        if (sig > 0) {
          log.line("S " + std::to_string(sig));
          stop_all = true;
          cancel_all();
          return;
        }
      }
    });
  }

  auto body = [&](int t) {
    lease_options lo;
    lo.ttl = milliseconds(ttl_ms);
    lo.watchdog = true;
    lo.poll_initial = milliseconds(1);
    lo.poll_max = milliseconds(20);
    workload_lock lock(db, kind, name, lo, "w" + std::to_string(id) + "." + std::to_string(t));
    while (!stop_all.load() && ::access(stop.c_str(), F_OK) != 0) {
      cancellation c;
      {
        std::lock_guard<std::mutex> l(mu);
        current[t] = c;
        if (stop_all.load()) c.cancel();
      }
      std::optional<workload_hold> g;
      if (t == 0) set_slot(slot_in_acquire);
      try {
        g = lock.acquire(milliseconds(5000), c);
      } catch (const dblock::error& e) {
        if (t == 0) set_slot(slot_running);
        if (e.code() == errc::cancelled) {
          log.line("C " + std::to_string(t));
        } else {
          log.line(std::string("E acquire ") + dblock::to_string(e.kind()) + ": " + e.what());
          std::this_thread::sleep_for(milliseconds(rnd(5, 30)));
        }
        continue;
      }
      if (t == 0) set_slot(slot_holding);
      const long long fence = g->fence();
      const std::string token = g->owner_token();
      const long long enter = raw_monotonic_ns();
      log.line("G " + std::to_string(fence) + " " + std::to_string(enter));
      // A grant that returned past its local validity (this thread starved by the storm or a
      // loaded machine) promises no time-based exclusion: the analysis leaves it out of the
      // grant order, as the counter worker's (its fenced write below is still checked).
      if (!g->valid()) log.line("V " + std::to_string(fence));
      std::this_thread::sleep_for(milliseconds(rnd(0, 5)));
      log.line("A " + std::to_string(fence));
      long long n = 0;
      try {
        g->fenced([&](soci::session& sql) {
          sql << "SELECT n FROM " << counter << " WHERE id = 1", soci::into(n);
          ++n;
          sql << "UPDATE " << counter << " SET n = :n WHERE id = 1", soci::use(n);
          sql << "INSERT INTO " << items << " (n, fence, worker, token) VALUES (:n, :f, :w, :t)",
              soci::use(n), soci::use(fence), soci::use(id), soci::use(token);
        });
        log.line("K " + std::to_string(fence) + " " + std::to_string(n) + " " +
                 std::to_string(enter) + " " + std::to_string(raw_monotonic_ns()));
      } catch (const dblock::error& e) {
        // No lost replies here (no proxy): lease_lost or another error, rolled back.
        log.line((e.code() == errc::lease_lost ? "L " : "X ") + std::to_string(fence));
      }
      log.line("r " + std::to_string(fence) + " " + std::to_string(raw_monotonic_ns()));
      try {
        g->release();
      } catch (const std::exception& e) {
        log.line(std::string("E release: ") + e.what());
      }
      g.reset();
      if (t == 0) set_slot(slot_running);
    }
  };
  std::thread waiter([&] { body(1); });
  std::thread canceller([&] {
    while (!stop_all.load() && ::access(stop.c_str(), F_OK) != 0) {
      std::this_thread::sleep_for(milliseconds(rnd(5, 80)));
      std::lock_guard<std::mutex> l(mu);
      auto it = current.find(1);
      if (it != current.end()) it->second.cancel();
    }
  });
  set_slot(slot_running);
  body(0);
  waiter.join();
  canceller.join();
  if (stop_all.load()) {
    // A handled signal: exit at once; every guard was released by its destructor.
    if (signal_thread.joinable()) signal_thread.join();
    return 0;
  }
  write_file_atomic(dir + "/idle" + std::to_string(id), "idle\n");
  // Idle but alive (its lease_lock objects are gone, nothing may renew) until told to exit.
  while (!stop_all.load() && ::access(exit_file.c_str(), F_OK) != 0)
    std::this_thread::sleep_for(milliseconds(10));
  done = true;
  if (signal_thread.joinable()) signal_thread.join();
  return 0;
}

namespace {

struct lock_snapshot {
  long long held = 0;  // hold_count > 0 and expires_at in the future (database clock)
  long long unexpired = 0;
  std::map<std::string, long long> expires_us;
  std::string held_names;
};

lock_snapshot snapshot(const database& db) {
  lock_snapshot s;
  list_options o;
  o.include_free = true;
  for (const auto& l : list_locks(db, o)) {
    const bool live = l.expires_in.count() > 0;
    if (live) ++s.unexpired;
    if (live && l.hold_count > 0) {
      ++s.held;
      s.held_names += " " + l.name + "(pid " + std::to_string(l.holder_pid) + ", " +
                      std::to_string(l.expires_in.count() / 1000) + " ms left)";
    }
    s.expires_us[l.name] =
        std::chrono::duration_cast<std::chrono::microseconds>(l.expires_at.time_since_epoch())
            .count();
  }
  return s;
}

long long moved(const lock_snapshot& a, const lock_snapshot& b) {
  long long n = 0;
  for (const auto& kv : b.expires_us) {
    auto it = a.expires_us.find(kv.first);
    if (it == a.expires_us.end() || it->second != kv.second) ++n;
  }
  return n;
}

}  // namespace

namespace {

void run_storm(context& ctx, const std::string& kind, const std::string& scenario, int interrupts) {
  const int ttl_ms = 500;
  create_workload_tables(ctx);
  temp_dir dir("faults-orphan");
  shared_slots slots(dir.file("slots"), 64, true);
  workload w;  // for analyze(): the logs' directory and the tables
  w.dir = dir.path;
  w.prefix = ctx.prefix;
  const std::string lock = "storm-" + random_suffix();
  process_set ps;
  struct proc {
    int pid;
    bool handle;
  };
  std::vector<proc> procs(4);
  int spawned = 0;
  auto spawn = [&](int i) {
    __atomic_store_n(&slots.v[i], 0LL, __ATOMIC_SEQ_CST);
    const bool handle = spawned++ % 2 == 0;
    procs[static_cast<std::size_t>(i)] = {
        ps.spawn("orphan_worker", {ctx.url, ctx.prefix, lock, std::to_string(ttl_ms), dir.path,
                                   std::to_string(i), handle ? "1" : "0", kind}),
        handle};
  };
  for (int i = 0; i < 4; ++i)
    spawn(i);
  std::this_thread::sleep_for(milliseconds(600));
  long long mid_acquire = 0, bad_exit = 0, orphaned = 0;
  std::string bad;
  long long last_interrupt = 0;
  // The storm goes on past `interrupts` (four times as many at most) until a write was
  // acknowledged and a wait cancelled: a slow machine (or the sanitizers' halved count) then
  // gets more interrupts instead of failing the checks of both below.
  auto progressed = [&] { return log_lines(w, 0, 4, "K") > 0 && log_lines(w, 0, 4, "C") > 0; };
  for (int k = 0; k < interrupts || (k < 4 * interrupts && !progressed()); ++k) {
    std::this_thread::sleep_for(milliseconds(rnd(50, 250)));
    // A started worker, preferably one whose main thread is inside acquire().
    int victim = -1;
    for (int spin = 0; spin < 200 && victim < 0; ++spin) {
      int i = static_cast<int>(rnd(0, 3));
      if (__atomic_load_n(&slots.v[i], __ATOMIC_SEQ_CST) == slot_in_acquire) victim = i;
      if (victim < 0) std::this_thread::sleep_for(milliseconds(1));
    }
    if (victim >= 0) ++mid_acquire;
    for (int spin = 0; spin < 5000 && victim < 0; ++spin) {
      int i = static_cast<int>(rnd(0, 3));
      if (__atomic_load_n(&slots.v[i], __ATOMIC_SEQ_CST) != 0) victim = i;
      if (victim < 0) std::this_thread::sleep_for(milliseconds(1));
    }
    REQUIRE(victim >= 0);
    const int sig = k % 2 == 0 ? SIGINT : SIGTERM;
    const proc p = procs[static_cast<std::size_t>(victim)];
    ::kill(p.pid, sig);
    last_interrupt = monotonic_ns();
    const int st = ps.wait(p.pid, std::chrono::seconds(15));
    const int want = p.handle ? 0 : 128 + sig;
    if (!p.handle) {
      // Leases the dead process left behind (they must expire on their own).
      for (const auto& l : list_locks(ctx.db))
        if (l.holder_pid == p.pid) ++orphaned;
    }
    if (st != want) {
      ++bad_exit;
      bad += " pid " + std::to_string(p.pid) + (p.handle ? " (handling)" : " (default)") +
             " exit " + std::to_string(st);
    }
    spawn(victim);
  }
  // The survivors stop acquiring and stay alive.
  write_file_atomic(dir.file("stop"), "stop\n");
  for (int i = 0; i < 4; ++i)
    CHECK(wait_for_file(dir.file("idle" + std::to_string(i)), std::chrono::seconds(30)));
  sleep_until_monotonic(last_interrupt + 3LL * ttl_ms * 1000000LL);
  auto s1 = snapshot(ctx.db);
  std::this_thread::sleep_for(milliseconds(ttl_ms));
  auto s2 = snapshot(ctx.db);
  const long long renewed = moved(s1, s2);
  write_file_atomic(dir.file("exit"), "exit\n");
  auto st = ps.wait_all(std::chrono::seconds(30));
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("survivor " << i << " exit status " << st[i]);
    CHECK(st[i] == 0);
  }
  auto a = analyze(ctx.db, ctx, w, true);
  long long cancelled = 0, handled = 0;
  for (int i = 0; i < 4; ++i) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(i) + ".log")));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("C ", 0) == 0) ++cancelled;
      if (line.rfind("S ", 0) == 0) ++handled;
    }
  }
  INFO(a.summary() << "\ninterrupts " << interrupts << " (mid-acquire " << mid_acquire
                   << ", orphaned leases at kill " << orphaned << ", handled " << handled
                   << "), cancelled waits " << cancelled
                   << "\nheld 3 x TTL after the last interrupt: " << s1.held << s1.held_names
                   << "; one TTL later: " << s2.held << "; rows whose expires_at moved: " << renewed
                   << "\nunexpected exits:" << bad);
  CHECK(s1.held == 0);
  CHECK(s2.held == 0);
  CHECK(renewed == 0);
  CHECK(bad_exit == 0);
  CHECK(a.violations == 0);
  CHECK(a.acked > 0);
  CHECK(cancelled > 0);
  if (kind == "election") {
    // Nobody leads: observe() shows no leader once the leases are gone.
    const auto leader = election::observe(ctx.db, lock);
    INFO("leader 3 x TTL after the last interrupt: " << (leader ? leader->identity : "none"));
    CHECK_FALSE(leader);
  }
  report(scenario, ctx.backend, interrupts, interrupts + cancelled,
         s1.held + s2.held + renewed + bad_exit + a.violations,
         "mid_acquire=" + std::to_string(mid_acquire) + " handled=" + std::to_string(handled) +
             " orphaned_at_kill=" + std::to_string(orphaned) + " cancelled_waits=" +
             std::to_string(cancelled) + " killed_mid_write=" + std::to_string(a.killed_mid_write) +
             " acked=" + std::to_string(a.acked));
}

}  // namespace

DBLOCK_TEST("interrupt storm on acquirers: no lease held or renewed 3 x TTL later",
            "[faults][orphan]") {
  run_storm(ctx, "lease", "7-interrupt-storm", count(12, 80));
}

// The same with the lock being the one permit of a semaphore of 1: no permit stays taken.
DBLOCK_TEST("interrupt storm on semaphore acquirers: no permit held or renewed 3 x TTL later",
            "[faults][orphan][semaphore]") {
  run_storm(ctx, "semaphore", "7-interrupt-storm-permit", count(8, 80));
}

// The same with candidates of an election: no leadership stays held or renewed, no leader shown.
DBLOCK_TEST("interrupt storm on election candidates: no leadership held or renewed 3 x TTL later",
            "[faults][orphan][election]") {
  run_storm(ctx, "election", "7-interrupt-storm-leader", count(8, 80));
}

DBLOCK_TEST("negative control: a leaked renewing guard is caught by the orphan check",
            "[faults][orphan][control]") {
  // The leak is forced (this process holds the guard and its watchdog renews it), so the check
  // must see it every time the watchdog kept the lease: held at both snapshots, renewed between
  // them. Whether the watchdog keeps a 600 ms lease depends on the machine's pace (a loaded one
  // can hold its thread off past the TTL, and the control then sees nothing held): an attempt in
  // which the guard reported its lease lost runs again with twice and four times the TTL. While
  // the guard kept its lease, a check that finds it not held, or not renewed, fails at once.
  at_machine_pace([&](int scale, bool last) -> std::vector<std::string> {
    const int ttl_ms = 600 * scale;
    std::atomic<bool> lost{false};
    lease_options lo;
    lo.ttl = milliseconds(ttl_ms);
    lo.watchdog = true;
    lo.on_lost = [&lost](const error&) { lost = true; };
    lease_lock lock(ctx.db, "leak-" + random_suffix(), lo);
    auto g = lock.try_acquire();  // never released while the check runs: an orphan that renews
    REQUIRE(g);
    std::this_thread::sleep_for(milliseconds(3 * ttl_ms));
    auto s1 = snapshot(ctx.db);
    std::this_thread::sleep_for(milliseconds(ttl_ms));
    auto s2 = snapshot(ctx.db);
    const long long renewed = moved(s1, s2);
    const bool kept = !lost.load() && g->valid();
    INFO("TTL " << ttl_ms << " ms: held " << s1.held << s1.held_names << ", then " << s2.held
                << ", moved " << renewed << "; the guard " << (kept ? "kept" : "lost")
                << " its lease");
    if (!kept && !last)
      return {"the watchdog lost the leaked lease at TTL " + std::to_string(ttl_ms) + " ms"};
    CHECK(kept);
    CHECK(s1.held == 1);
    CHECK(s2.held == 1);
    CHECK(renewed == 1);
    report("control-7-leaked-guard", ctx.backend, 1, 1, s1.held + s2.held + renewed,
           "expected=violations>0 ttl_ms=" + std::to_string(ttl_ms));
    try {
      g->release();
    } catch (const error&) {
    }
    return {};
  });
}
