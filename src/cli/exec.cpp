// dblock exec: run a command while holding a lease lock, or a permit of a semaphore (itself a
// lease). The command runs as a child process with DBLOCK_FENCE, DBLOCK_OWNER and DBLOCK_LOCK set
// (and DBLOCK_PERMIT for a permit); the signals dblock gets are passed on to it; when the lease
// is lost it is sent SIGTERM (SIGKILL after --kill-after) and dblock exits 76.
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
template <class Lock>
std::optional<dblock::lease_guard> acquire(Lock& lock, milliseconds wait) {
  std::optional<dblock::lease_guard> guard;
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

// The command's argv and environment, built before fork(): the forked child of a process with
// threads (the watchdog) may only call async-signal-safe functions, and setenv() or malloc()
// there can deadlock on a lock another thread held at the fork.
struct command_image {
  std::vector<std::string> env_text;
  std::vector<char*> argv, envp;
};

command_image make_image(const exec_options& x, const dblock::lease_guard& guard,
                         const std::string& fence) {
  command_image im;
  const std::string ours[] = {"DBLOCK_FENCE=", "DBLOCK_OWNER=", "DBLOCK_LOCK=", "DBLOCK_PERMIT="};
  for (char** e = environ; *e; ++e) {
    bool replaced = false;
    for (const auto& o : ours)
      replaced = replaced || std::strncmp(*e, o.c_str(), o.size()) == 0;
    if (!replaced) im.env_text.emplace_back(*e);
  }
  im.env_text.push_back("DBLOCK_FENCE=" + fence);
  im.env_text.push_back("DBLOCK_OWNER=" + guard.owner_token());
  if (!x.use_semaphore) {
    im.env_text.push_back("DBLOCK_LOCK=" + x.lock);
  } else {
    im.env_text.push_back("DBLOCK_LOCK=" + x.semaphore);
    im.env_text.push_back("DBLOCK_PERMIT=" + std::to_string(dblock::semaphore::permit_slot(guard)));
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
pid_t start_command(const exec_options& x, const dblock::lease_guard& guard) {
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    sigaction(sig, &sa, nullptr);

  const command_image im = make_image(x, guard, std::to_string(guard.fence()));
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

// What the command runs under, for messages: the lock, or "NAME (permit of N)".
std::string what(const exec_options& x) {
  return x.use_semaphore ? x.semaphore : x.lock;
}

// After the command: dblock's exit status (`code` is the command's own).
int finish(const exec_options& x, std::optional<dblock::lease_guard>& guard, bool lost, int code) {
  if (lost) {
    std::cerr << "dblock exec: the lease on '" << shown(what(x))
              << "' was lost while the command ran (it was sent SIGTERM); exit " << exit_lease_lost
              << "\n";
    guard.reset();
    return exit_lease_lost;
  }
  try {
    guard->release();
  } catch (const dblock::error& e) {
    if (e.code() == dblock::errc::lease_lost) {
      std::cerr << "dblock exec: " << shown(e.what()) << "\n";
      return exit_lease_lost;
    }
    // The command ran to its end under the lease; only the release failed (for example the
    // connection broke). The lease expires by itself within --ttl, nobody renews it. Report
    // and keep the command's status, which is what the caller scripts on.
    std::cerr << "dblock exec: warning: could not release '" << shown(what(x)) << "' ("
              << shown(e.what()) << "); it expires within " << x.ttl << "\n";
  }
  return code;
}

}  // namespace

CLI::App* add_exec(CLI::App& app, common_options& common, exec_options& x) {
  auto* exec =
      app.add_subcommand("exec", "run a command while holding a lease lock or a semaphore permit");
  add_common(exec, common);
  // Exactly one of --lock and --semaphore (an empty value is given, and refused as a name).
  auto* what = exec->add_option_group("lock or semaphore")->require_option(1);
  auto* lock = what->add_option("--lock", x.lock, "lock (resource) name");
  auto* sem = what->add_option("--semaphore", x.semaphore,
                               "instead of --lock: take one permit of this semaphore (with "
                               "--permits; see the README)")
                  ->each([&x](const std::string&) { x.use_semaphore = true; });
  auto* permits = exec->add_option("--permits", x.permits,
                                   "the semaphore's number of permits: every user of the name "
                                   "must give the same (1..1000)");
  lock->excludes(sem);
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
  return exec;
}

int run_exec(const common_options& c, const exec_options& x) {
  auto db = open_db(c);
  std::atomic<bool> lost{false};
  dblock::lease_options lo = lease_options_for(x, lost);
  milliseconds wait = parse_duration(x.wait, "--wait");
  milliseconds kill_after = parse_duration(x.kill_after, "--kill-after");
  std::optional<dblock::lease_guard> guard;
  if (!x.use_semaphore) {
    dblock::lease_lock lock(db, x.lock, lo);
    guard = acquire(lock, wait);
  } else {
    dblock::semaphore sem(db, x.semaphore, x.permits, lo);
    guard = acquire(sem, wait);
  }
  if (!guard) {
    if (!x.use_semaphore)
      std::cerr << "dblock exec: lock '" << shown(x.lock) << "' is held by another owner";
    else
      std::cerr << "dblock exec: all " << x.permits << " permits of semaphore '"
                << shown(x.semaphore) << "' are held";
    if (wait.count() > 0)
      std::cerr << (!x.use_semaphore ? " and was not freed within " : " and none was freed within ")
                << x.wait;
    std::cerr << "; not running the command\n";
    return exit_not_acquired;
  }
  if (c.verbose) {
    std::cerr << "dblock exec: acquired '" << shown(what(x)) << "'";
    if (x.use_semaphore) std::cerr << " permit " << dblock::semaphore::permit_slot(*guard);
    std::cerr << " fence " << guard->fence() << "\n";
  }

  pid_t pid = start_command(x, *guard);
  child_pid = pid;
  if (lost) ::kill(pid, SIGTERM);
  int status = wait_command(pid, lost, kill_after);
  child_pid = 0;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return finish(x, guard, lost, code);
}

}  // namespace dblock::cli
