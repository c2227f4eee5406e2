// dblock exec: run a command while holding a lock (the writer of the read-write lock of that
// name), a reader of it (--shared), a set of locks (all or nothing), or a permit of a semaphore;
// each is a lease. The command runs as a child process with DBLOCK_FENCE, DBLOCK_OWNER and
// DBLOCK_LOCK set (DBLOCK_PERMIT too for a permit, DBLOCK_SHARED=1 for a reader; for a set,
// DBLOCK_LOCK_COUNT and DBLOCK_LOCK_i, DBLOCK_FENCE_i, DBLOCK_OWNER_i per name instead); the
// signals dblock gets are passed on to it; when a lease is lost it is sent SIGTERM (SIGKILL after
// --kill-after) and dblock exits 76.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"

namespace dblock::cli {

namespace {

using std::chrono::milliseconds;

std::atomic<pid_t> child_pid{0};

void forward_signal(int sig) {
  pid_t p = child_pid.load();
  if (p > 0) ::kill(p, sig);
}

// The lease: renewed by the watchdog; when it is lost, `lost` is set and the command (once it
// runs) is sent SIGTERM.
dblock::lease_options lease_options_for(const exec_options& x, std::atomic<bool>& lost) {
  dblock::lease_options lo;
  lo.ttl = parse_duration(x.ttl, "--ttl");
  lo.watchdog = true;
  lo.fair = x.fair;
  lo.on_lost = [&lost](const dblock::error& e) {
    lost = true;
    std::cerr << "dblock exec: " << shown(e.what()) << "; sending SIGTERM to the command\n";
    pid_t p = child_pid.load();
    if (p > 0) ::kill(p, SIGTERM);
  };
  return lo;
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

// The command's argv and environment, built before fork(): the forked child of a process with
// threads (the watchdog) may only call async-signal-safe functions, and setenv() or malloc()
// there can deadlock on a lock another thread held at the fork.
struct command_image {
  std::vector<std::string> env_text;
  std::vector<char*> argv, envp;
};

command_image make_image(const exec_options& x, const holding& h) {
  command_image im;
  // Ours, inherited from an outer dblock exec: replaced (the indexed ones of a set too).
  const std::string ours[] = {"DBLOCK_FENCE=",  "DBLOCK_OWNER=", "DBLOCK_LOCK=",  "DBLOCK_PERMIT=",
                              "DBLOCK_SHARED=", "DBLOCK_FENCE_", "DBLOCK_OWNER_", "DBLOCK_LOCK_"};
  for (char** e = environ; *e; ++e) {
    bool replaced = false;
    for (const auto& o : ours)
      replaced = replaced || std::strncmp(*e, o.c_str(), o.size()) == 0;
    if (!replaced) im.env_text.emplace_back(*e);
  }
  if (h.set) {
    const auto& leases = h.set->leases();
    im.env_text.push_back("DBLOCK_LOCK_COUNT=" + std::to_string(leases.size()));
    for (std::size_t i = 0; i < leases.size(); ++i) {
      const std::string k = std::to_string(i);
      im.env_text.push_back("DBLOCK_LOCK_" + k + "=" + leases[i].name());
      im.env_text.push_back("DBLOCK_FENCE_" + k + "=" + std::to_string(leases[i].fence()));
      im.env_text.push_back("DBLOCK_OWNER_" + k + "=" + leases[i].owner_token());
    }
  } else {
    const dblock::lease_guard& guard = *h.one;
    im.env_text.push_back("DBLOCK_FENCE=" + std::to_string(guard.fence()));
    im.env_text.push_back("DBLOCK_OWNER=" + guard.owner_token());
    if (x.use_shared) {
      im.env_text.push_back("DBLOCK_LOCK=" + x.shared);
      im.env_text.push_back("DBLOCK_SHARED=1");
    } else if (!x.use_semaphore) {
      im.env_text.push_back("DBLOCK_LOCK=" + x.locks.front());
    } else {
      im.env_text.push_back("DBLOCK_LOCK=" + x.semaphore);
      im.env_text.push_back("DBLOCK_PERMIT=" +
                            std::to_string(dblock::semaphore::permit_slot(guard)));
    }
  }
  for (auto& e : im.env_text)
    im.envp.push_back(e.data());
  im.envp.push_back(nullptr);
  for (const auto& a : x.command)
    im.argv.push_back(const_cast<char*>(a.c_str()));
  im.argv.push_back(nullptr);
  return im;
}

// In the forked child: never returns; async-signal-safe calls only.
[[noreturn]] void exec_command(const command_image& im) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    signal(sig, SIG_DFL);
  execvpe(im.argv[0], im.argv.data(), im.envp.data());
  const int err = errno;
  const char* why = err == ENOENT ? "': not found\n" : "': cannot execute\n";
  const char* parts[] = {"dblock exec: cannot run '", im.argv[0], why};
  for (const char* part : parts)
    if (::write(STDERR_FILENO, part, std::strlen(part)) < 0) break;
  _exit(err == ENOENT ? 127 : 126);
}

// Forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the command, then starts it.
pid_t start_command(const exec_options& x, const holding& h) {
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    sigaction(sig, &sa, nullptr);

  const command_image im = make_image(x, h);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) exec_command(im);
  return pid;
}

// Waits for the command to end; once the lease is lost, SIGKILL after `kill_after`. Returns its
// wait status.
int wait_command(pid_t pid, const std::atomic<bool>& lost, milliseconds kill_after) {
  int status = 0;
  bool killed = false;
  auto term_sent = std::chrono::steady_clock::time_point::max();
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (lost && term_sent == std::chrono::steady_clock::time_point::max())
      term_sent = std::chrono::steady_clock::now();
    if (lost && !killed && std::chrono::steady_clock::now() - term_sent > kill_after) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  return status;
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
              << "' was lost while the command ran (it was sent SIGTERM); exit " << exit_lease_lost
              << "\n";
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

CLI::App* add_exec(CLI::App& app, common_options& common, exec_options& x) {
  auto* exec =
      app.add_subcommand("exec", "run a command while holding a lease lock or a semaphore permit");
  add_common(exec, common);
  // Exactly one of --lock, --shared and --semaphore (an empty value is refused as a name).
  auto* what = exec->add_option_group("lock, reader or semaphore")->require_option(1);
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
  lock->excludes(sem);
  shared->excludes(lock);
  shared->excludes(sem);
  sem->needs(permits);
  permits->needs(sem);
  exec->add_option("--ttl", x.ttl, "lease length, renewed at ttl/3 while the command runs")
      ->capture_default_str();
  exec->add_option("--wait", x.wait, "how long to wait for the lock (0s: try once)")
      ->capture_default_str();
  exec->add_option("--kill-after", x.kill_after,
                   "after the lease is lost and SIGTERM sent, SIGKILL after this long")
      ->capture_default_str();
  exec->add_flag("--fair", x.fair,
                 "wait in arrival order: waiters queued before this one get the lock first "
                 "(see docs/waiting.md)")
      ->excludes(sem);
  exec->add_option("command", x.command, "command and arguments (after --)")->required();
  exec->positionals_at_end();
  exec->footer(
      "The command runs with these variables set (any it inherited by these names are removed):\n"
      "  DBLOCK_LOCK    the lock's name (--lock, --shared or --semaphore)\n"
      "  DBLOCK_FENCE   the lease's fence: pass it to fenced writes, which refuse a stale one\n"
      "  DBLOCK_OWNER   the lease's owner token\n"
      "  DBLOCK_PERMIT  with --semaphore: the permit held (0..permits-1)\n"
      "  DBLOCK_SHARED  with --shared: 1\n"
      "With several --lock (a set): DBLOCK_LOCK_COUNT, and DBLOCK_LOCK_i, DBLOCK_FENCE_i and\n"
      "DBLOCK_OWNER_i for i = 0..count-1 in the set's order, instead of the three above.\n"
      "Exit status: the command's (128+N if killed by signal N); 75 when the lock stayed busy;\n"
      "76 when the lease was lost while the command ran (it was sent SIGTERM, then SIGKILL);\n"
      "70 when the outcome is unknown (in doubt); 64 usage; 69 cannot connect.");
  return exec;
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

int run_exec(const common_options& c, const exec_options& x) {
  auto db = open_db(c);
  std::atomic<bool> lost{false};
  dblock::lease_options lo = lease_options_for(x, lost);
  milliseconds wait = parse_duration(x.wait, "--wait");
  milliseconds kill_after = parse_duration(x.kill_after, "--kill-after");
  holding h = take(db, x, lo, wait);
  if (!h) {
    report_busy(x, wait);
    return exit_not_acquired;
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

  pid_t pid = start_command(x, h);
  child_pid = pid;
  if (lost) ::kill(pid, SIGTERM);
  int status = wait_command(pid, lost, kill_after);
  child_pid = 0;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return finish(x, h, lost, code);
}

}  // namespace dblock::cli
