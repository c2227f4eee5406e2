// dblock exec: run a command while holding a lock (the writer of the read-write lock of that
// name), a reader of it (--shared), a set of locks (all or nothing), or a permit of a semaphore;
// each is a lease. The command runs under a supervisor (supervise.cpp) with DBLOCK_FENCE,
// DBLOCK_OWNER and DBLOCK_LOCK set (DBLOCK_PERMIT too for a permit, DBLOCK_SHARED=1 for a reader;
// for a set, DBLOCK_LOCK_COUNT and DBLOCK_LOCK_i, DBLOCK_FENCE_i, DBLOCK_OWNER_i per name
// instead). The lease lives with the command's whole process tree: the signals dblock gets are
// passed on to every process of it; when the lease is lost, all of it gets SIGTERM (SIGKILL after
// --kill-after) and dblock exits 79; when dblock itself dies, by SIGKILL too, the supervisor ends
// the tree within --kill-after, well before the lease it no longer renews can expire.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "command.hpp"
#include "commands.hpp"
#include "tree.hpp"

namespace dblock::cli {

namespace {

using std::chrono::milliseconds;

// The lease: renewed by the watchdog; when it is lost, `lost` is set and the command's tree
// (once it runs) is ended.
dblock::lease_options lease_options_for(const exec_options& x, std::atomic<bool>& lost) {
  dblock::lease_options lo;
  lo.ttl = parse_duration(x.ttl, "--ttl");
  lo.watchdog = true;
  lo.fair = x.fair;
  lo.on_lost = [&lost](const dblock::error& e) {
    lost = true;
    tell_supervisor(0);  // first: a write to the terminal might wait (the command has it)
    std::cerr << "dblock exec: " << shown(e.what())
              << "; sending SIGTERM to every process of the command\n";
  };
  return lo;
}

// The lease's local validity ends --kill-after earlier than a plain lease's (its safety margin,
// TTL/10 by default, plus --kill-after): when renewals fail, the tree gets SIGTERM that much
// before the validity a plain lease would have, and SIGKILL at the latest when that validity
// ends, before the database can give the lease to another host. And when dblock dies before
// its local validity ran out, the lease still runs at least the margin plus --kill-after, the
// time the supervisor needs to end the tree.
void leave_time_to_end(dblock::lease_options& lo, milliseconds kill_after) {
  const milliseconds margin =
      lo.safety_margin.count() > 0 ? lo.safety_margin : std::max(milliseconds(1), lo.ttl / 10);
  lo.safety_margin = margin + kill_after;
}

// --wait: a duration, or "forever" (without limit: a hundred years, which every deadline of the
// library and the databases holds without overflow).
milliseconds wait_for(const std::string& text) {
  if (text == "forever" || text == "inf" || text == "infinity")
    return std::chrono::duration_cast<milliseconds>(std::chrono::hours(24 * 365 * 100));
  return parse_duration(text, "--wait");
}

// --kill-after: a sixth of the TTL unless given, and at most a third of it. When dblock dies, the
// lease it held was renewed at most a third of the TTL before, so it still runs two thirds of
// the TTL: the tree, SIGKILLed at --kill-after, is gone well before another holder can come.
milliseconds kill_after_for(const exec_options& x, milliseconds ttl) {
  if (x.kill_after.empty()) return std::max(milliseconds(1), ttl / 6);
  const milliseconds k = parse_duration(x.kill_after, "--kill-after");
  if (k > ttl / 3)
    throw dblock::error(dblock::errc::invalid_argument,
                        "--kill-after " + x.kill_after + " is longer than a third of --ttl " +
                            x.ttl +
                            ": if dblock died, the command's processes could outlive the lease it "
                            "no longer renews");
  return k;
}

// One try (wait 0) or waiting up to `wait`; nothing when the lock (or every permit) stayed busy.
template <class Guard, class Lock>
std::optional<Guard> acquire(Lock& lock, milliseconds wait) {
  std::optional<Guard> guard;
  try {
    if (wait.count() > 0)
      guard.emplace(lock.acquire(wait));
    else
      guard = lock.try_acquire();
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::timeout) throw;
  }
  return guard;
}

// What the command runs under: one lease (a lock or a permit) or a lock set.
struct holding {
  std::optional<dblock::lease_guard> one;
  std::optional<dblock::lock_set_guard> set;
  explicit operator bool() const { return one.has_value() || set.has_value(); }
  void release() {
    if (one)
      one->release();
    else
      set->release();
  }
  void reset() {
    one.reset();
    set.reset();
  }
};

// Takes what `x` names; nothing when it stayed busy.
holding take(const dblock::database& db, const exec_options& x, const dblock::lease_options& lo,
             milliseconds wait) {
  holding h;
  if (x.use_semaphore) {
    dblock::semaphore sem(db, x.semaphore, x.permits, lo);
    h.one = acquire<dblock::lease_guard>(sem, wait);
  } else if (x.use_shared || x.locks.size() == 1) {
    // One lock is the writer of the read-write lock of that name: it waits for readers
    // (--shared) already in, and holds back new ones.
    dblock::rwlock rw(db, x.use_shared ? x.shared : x.locks.front(), lo);
    try {
      if (x.use_shared)
        h.one = wait.count() > 0 ? std::optional<dblock::lease_guard>(rw.acquire_shared(wait))
                                 : rw.try_acquire_shared();
      else
        h.one = wait.count() > 0 ? std::optional<dblock::lease_guard>(rw.acquire(wait))
                                 : rw.try_acquire();
    } catch (const dblock::error& e) {
      if (e.code() != dblock::errc::timeout) throw;
    }
  } else {
    dblock::lock_set set(db, x.locks, lo);
    h.set = acquire<dblock::lock_set_guard>(set, wait);
  }
  return h;
}

// The variables that tell the command what it holds (the footer of add_exec lists them).
std::vector<std::string> lease_variables(const exec_options& x, const holding& h) {
  std::vector<std::string> v;
  if (h.set) {
    const auto& leases = h.set->leases();
    v.push_back("DBLOCK_LOCK_COUNT=" + std::to_string(leases.size()));
    for (std::size_t i = 0; i < leases.size(); ++i) {
      const std::string k = std::to_string(i);
      v.push_back("DBLOCK_LOCK_" + k + "=" + leases[i].name());
      v.push_back("DBLOCK_FENCE_" + k + "=" + std::to_string(leases[i].fence()));
      v.push_back("DBLOCK_OWNER_" + k + "=" + leases[i].owner_token());
    }
    return v;
  }
  const dblock::lease_guard& guard = *h.one;
  v.push_back("DBLOCK_FENCE=" + std::to_string(guard.fence()));
  v.push_back("DBLOCK_OWNER=" + guard.owner_token());
  if (x.use_shared) {
    v.push_back("DBLOCK_LOCK=" + x.shared);
    v.push_back("DBLOCK_SHARED=1");
  } else if (!x.use_semaphore) {
    v.push_back("DBLOCK_LOCK=" + x.locks.front());
  } else {
    v.push_back("DBLOCK_LOCK=" + x.semaphore);
    v.push_back("DBLOCK_PERMIT=" + std::to_string(dblock::semaphore::permit_slot(guard)));
  }
  return v;
}

// What the command runs under, for messages: the lock, the semaphore, or the set's names.
std::string what(const exec_options& x) {
  if (x.use_semaphore) return shown(x.semaphore);
  if (x.use_shared) return shown(x.shared);
  std::string out;
  for (const auto& n : x.locks)
    out += (out.empty() ? "" : "', '") + shown(n);
  return out;
}

// After the command: dblock's exit status (`code` is the command's own).
int finish(const exec_options& x, holding& guard, bool lost, int code) {
  if (lost) {
    std::cerr << "dblock exec: the lease on '" << what(x)
              << "' was lost while the command ran (its processes were sent SIGTERM, then "
                 "SIGKILL); exit "
              << exit_lease_lost << "\n";
    guard.reset();
    return exit_lease_lost;
  }
  try {
    guard.release();
  } catch (const dblock::error& e) {
    if (e.code() == dblock::errc::lease_lost) {
      std::cerr << "dblock exec: " << shown(e.what()) << "\n";
      return exit_lease_lost;
    }
    // The command ran to its end under the lease; only the release failed (for example the
    // connection broke). The lease expires by itself within --ttl, nobody renews it. Report
    // and keep the command's status, which is what the caller scripts on.
    std::cerr << "dblock exec: warning: could not release '" << what(x) << "' (" << shown(e.what())
              << "); it expires within " << x.ttl << "\n";
  }
  return code;
}

}  // namespace

// Exactly one of --lock, --shared, --semaphore and --once (an empty value is refused as a
// name), and --every with one --lock. Returns --semaphore.
static CLI::Option* add_exec_what(CLI::App* exec, exec_options& x) {
  auto* what = exec->add_option_group("lock, reader, semaphore or run")->require_option(1);
  auto* lock = what->add_option("--lock", x.locks,
                                "lock (resource) name; give --lock more than once to hold a set "
                                "of locks, taken all or nothing in one global order")
                   ->allow_extra_args(false);
  auto* sem = what->add_option("--semaphore", x.semaphore,
                               "instead of --lock: take one permit of this semaphore (with "
                               "--permits; see the README)")
                  ->each([&x](const std::string&) { x.use_semaphore = true; });
  auto* permits = exec->add_option("--permits", x.permits,
                                   "the semaphore's number of permits: every user of the name "
                                   "must give the same (1..1000)");
  auto* shared = what->add_option("--shared", x.shared,
                                  "instead of --lock: hold NAME as one of its readers (many at "
                                  "once; a --lock of NAME waits for them and holds new ones back)")
                     ->each([&x](const std::string&) { x.use_shared = true; });
  auto* once = what->add_option("--once", x.once,
                                "instead of --lock: run the command unless a success of KEY is "
                                "recorded in the database, at most one success ever across every "
                                "host (docs/run-once.md)");
  auto* every = exec->add_option("--every", x.every,
                                 "with one --lock NAME: run the command unless a success of NAME "
                                 "is recorded in the current slot of the database clock (slot = "
                                 "floor(time / PERIOD)); at most one success per slot");
  every->needs(lock);
  every->excludes(sem);
  every->excludes(shared);
  every->excludes(once);
  lock->excludes(sem);
  shared->excludes(lock);
  shared->excludes(sem);
  sem->needs(permits);
  permits->needs(sem);
  return sem;
}

// How long, how the command is given, and what ends it.
static void add_exec_how(CLI::App* exec, exec_options& x, CLI::Option* sem) {
  exec->add_option("--ttl", x.ttl, "lease length, renewed at ttl/3 while the command runs")
      ->capture_default_str();
  exec->add_option("--wait", x.wait,
                   "how long to wait for the lock (0s: try once; forever: without limit)")
      ->capture_default_str();
  exec->add_option("-E,--conflict-exit-code", x.conflict_exit_code,
                   "exit status when the lock stays busy (as flock's -E; 0..255)")
      ->capture_default_str()
      ->check(CLI::Range(0, 255));
  exec->add_option("--kill-after", x.kill_after,
                   "once the command's processes were sent SIGTERM (lease lost, dblock gone, or "
                   "left behind by the command), SIGKILL after this long (default: a sixth of "
                   "--ttl; at most a third)");
  exec->add_flag("--fair", x.fair,
                 "wait in arrival order: waiters queued before this one get the lock first "
                 "(see docs/waiting.md)")
      ->excludes(sem);
  auto* shell = exec->add_option("-c,--command", x.shell,
                                 "run this shell command line with /bin/sh -c (as flock -c), "
                                 "instead of a command after --");
  auto* command = exec->add_option("command", x.command, "command and arguments (after --)");
  shell->excludes(command);
  command->excludes(shell);
  exec->positionals_at_end();
}

CLI::App* add_exec(CLI::App& app, common_options& common, exec_options& x) {
  auto* exec =
      app.add_subcommand("exec", "run a command while holding a lease lock or a semaphore permit");
  add_common(exec, common);
  add_exec_how(exec, x, add_exec_what(exec, x));
  exec->footer(
      "The command runs with these variables set (any it inherited by these names are removed):\n"
      "  DBLOCK_LOCK    the lock's name (--lock, --shared or --semaphore)\n"
      "  DBLOCK_FENCE   the lease's fence: pass it to fenced writes, which refuse a stale one\n"
      "  DBLOCK_OWNER   the lease's owner token\n"
      "  DBLOCK_PERMIT  with --semaphore: the permit held (0..permits-1)\n"
      "  DBLOCK_SHARED  with --shared: 1\n"
      "With several --lock (a set): DBLOCK_LOCK_COUNT, and DBLOCK_LOCK_i, DBLOCK_FENCE_i and\n"
      "DBLOCK_OWNER_i for i = 0..count-1 in the set's order, instead of the three above.\n"
      "With --once or --every: DBLOCK_SLOT, the slot (0 for --once).\n"
      "The lease lives with the command's whole process tree: signals are passed on to all of\n"
      "it, processes the command leaves behind are ended before the lease is released, and if\n"
      "dblock itself dies (even by SIGKILL) every process of the tree is sent SIGTERM, then\n"
      "SIGKILL after --kill-after (docs/cli.md).\n"
      "Exit status: the command's (128+N if killed by signal N); 75 when the lock stayed busy\n"
      "(-E to choose); 79 when the lease was lost while the command ran (its processes were sent\n"
      "SIGTERM, then SIGKILL); 70 when the outcome is unknown (in doubt) or the supervisor died;\n"
      "64 usage; 69 cannot connect; 78 schema missing.");
  return exec;
}

// --once KEY and --every PERIOD --lock NAME: the run goes through run_once() / run_in_slot(),
// which record it; the command runs as any exec's, under the supervisor, with DBLOCK_SLOT too.
static int run_recorded(const common_options& c, const exec_options& x) {
  const bool once = !x.once.empty();
  if (!once && x.locks.size() != 1)
    throw dblock::error(dblock::errc::invalid_argument, "--every takes exactly one --lock NAME");
  const std::string key = once ? x.once : x.locks.front();
  const milliseconds period = once ? milliseconds(0) : parse_duration(x.every, "--every");
  if (!once && period.count() <= 0)
    throw dblock::error(dblock::errc::invalid_argument, "--every must be above zero");
  auto db = open_db(c);
  std::atomic<bool> lost{false};
  dblock::run_options ro;
  ro.lease = lease_options_for(x, lost);
  ro.wait = wait_for(x.wait);
  const milliseconds kill_after = kill_after_for(x, ro.lease.ttl);
  leave_time_to_end(ro.lease, kill_after);
  auto job = [&](dblock::lease_guard& g, std::int64_t slot) {
    if (c.verbose)
      std::cerr << "dblock exec: acquired '" << shown(key) << "' fence " << g.fence() << ", slot "
                << slot << "\n";
    const pid_t pid =
        start_command(x.command,
                      {"DBLOCK_LOCK=" + key, "DBLOCK_FENCE=" + std::to_string(g.fence()),
                       "DBLOCK_OWNER=" + g.owner_token(), "DBLOCK_SLOT=" + std::to_string(slot)},
                      kill_after);
    if (lost) tell_supervisor(0);
    return wait_command(pid, kill_after);
  };
  dblock::run_result r;
  try {
    r = once ? dblock::run_once(db, key, job, ro) : dblock::run_in_slot(db, key, period, job, ro);
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::lease_lost) throw;
    std::cerr << "dblock exec: the lease on '" << shown(key)
              << "' was lost while the command ran (its processes were sent SIGTERM, then "
                 "SIGKILL); the run is not recorded as done: "
              << shown(e.what()) << "; exit " << exit_lease_lost << "\n";
    return exit_lease_lost;
  }
  switch (r.what) {
    case dblock::run_result::outcome::busy:
      std::cerr << "dblock exec: '" << shown(key) << "' is running elsewhere (its lock is held)";
      if (ro.wait.count() > 0) std::cerr << " and was not freed within " << x.wait;
      std::cerr << "; not running the command\n";
      return x.conflict_exit_code;
    case dblock::run_result::outcome::done_already:
      if (c.verbose)
        std::cerr << "dblock exec: '" << shown(key) << "' already succeeded"
                  << (once ? std::string() : " in slot " + std::to_string(r.slot)) << " (host "
                  << shown(r.done_by->host) << ", pid " << r.done_by->pid << ", fence "
                  << r.done_by->fence << "); not running it again\n";
      return exit_ok;
    case dblock::run_result::outcome::ran:
      break;
  }
  if (lost) {
    std::cerr << "dblock exec: the lease on '" << shown(key)
              << "' was lost while the command ran; exit " << exit_lease_lost << "\n";
    return exit_lease_lost;
  }
  return r.status;
}

// Why the command does not run: the lock, every permit or a member of the set stayed busy.
void report_busy(const exec_options& x, milliseconds wait) {
  if (x.use_semaphore)
    std::cerr << "dblock exec: all " << x.permits << " permits of semaphore '" << shown(x.semaphore)
              << "' are held";
  else if (x.use_shared)
    std::cerr << "dblock exec: lock '" << shown(x.shared) << "' is held or awaited by a writer";
  else if (x.locks.size() == 1)
    std::cerr << "dblock exec: lock '" << shown(x.locks.front())
              << "' is held by another owner (or readers are in)";
  else
    std::cerr << "dblock exec: a lock of the set '" << what(x)
              << "' is held by another owner (none of them is kept)";
  if (wait.count() > 0)
    std::cerr << (x.use_semaphore ? " and none was freed within " : " and was not freed within ")
              << x.wait;
  std::cerr << "; not running the command\n";
}

int run_exec(const common_options& c, const exec_options& given) {
  remember_inherited_fds();
  exec_options x = given;
  if (!x.shell.empty()) x.command = {"/bin/sh", "-c", x.shell};
  if (x.command.empty())
    throw dblock::error(dblock::errc::invalid_argument,
                        "no command: give it after -- (dblock exec --lock NAME -- CMD ARGS...) or "
                        "as a shell command line with -c");
  if (!x.once.empty() || !x.every.empty()) return run_recorded(c, x);
  auto db = open_db(c);
  std::atomic<bool> lost{false};
  dblock::lease_options lo = lease_options_for(x, lost);
  const milliseconds wait = wait_for(x.wait);
  const milliseconds kill_after = kill_after_for(x, lo.ttl);
  leave_time_to_end(lo, kill_after);
  holding h = take(db, x, lo, wait);
  if (!h) {
    report_busy(x, wait);
    return x.conflict_exit_code;
  }
  if (c.verbose) {
    if (h.set) {
      for (const auto& g : h.set->leases())
        std::cerr << "dblock exec: acquired '" << shown(g.name()) << "' fence " << g.fence()
                  << "\n";
    } else {
      std::cerr << "dblock exec: acquired '" << what(x) << "'";
      if (x.use_semaphore) std::cerr << " permit " << dblock::semaphore::permit_slot(*h.one);
      std::cerr << " fence " << h.one->fence() << "\n";
    }
  }

  const pid_t pid = start_command(x.command, lease_variables(x, h), kill_after);
  if (lost) tell_supervisor(0);
  const int code = wait_command(pid, kill_after);
  return finish(x, h, lost, code);
}

}  // namespace dblock::cli
