// dblock's side of the command's supervisor (supervise.cpp): the control pipe, the signals passed
// on through it, the supervisor's start and end.
#include "command.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common.hpp"
#include "tree.hpp"

namespace dblock::cli {

using std::chrono::milliseconds;

namespace {

// The write end of the supervisor's control pipe (supervise.cpp): one byte per order, 0 to end
// the command's tree, N to pass signal N on to it. -1 before the supervisor runs.
std::atomic<int> control_fd{-1};

}  // namespace

void tell_supervisor(unsigned char order) {
  const int fd = control_fd.load();
  if (fd >= 0) (void)!::write(fd, &order, 1);  // async-signal-safe; EPIPE once it is gone
}

namespace {

void forward_signal(int sig) {
  tell_supervisor(static_cast<unsigned char>(sig));
}

// The command's argv and environment, built before fork(): the forked child of a process with
// threads (the watchdog) may only call async-signal-safe functions, and setenv() or malloc()
// there can deadlock on a lock another thread held at the fork.
struct command_image {
  std::vector<std::string> env_text, args;
  std::vector<char*> argv, envp;
};

// The supervisor's argv (`dblock __supervise CTL KILL_AFTER_MS IGNORED -- CMD...`, tree.hpp) and
// the command's environment (`vars` added), which the supervisor runs under and passes on.
command_image make_image(const std::vector<std::string>& command,
                         const std::vector<std::string>& vars, int control_read,
                         milliseconds kill_after, unsigned long long ignored) {
  command_image im;
  // Ours, inherited from an outer dblock exec: replaced (the indexed ones of a set too).
  const std::string ours[] = {
      "DBLOCK_FENCE=", "DBLOCK_OWNER=", "DBLOCK_LOCK=",  "DBLOCK_PERMIT=", "DBLOCK_SHARED=",
      "DBLOCK_SLOT=",  "DBLOCK_FENCE_", "DBLOCK_OWNER_", "DBLOCK_LOCK_"};
  for (char** e = environ; *e; ++e) {
    bool replaced = false;
    for (const auto& o : ours)
      replaced = replaced || std::strncmp(*e, o.c_str(), o.size()) == 0;
    if (!replaced) im.env_text.emplace_back(*e);
  }
  im.env_text.insert(im.env_text.end(), vars.begin(), vars.end());
  for (auto& e : im.env_text)
    im.envp.push_back(e.data());
  im.envp.push_back(nullptr);
  im.args = {"dblock",
             "__supervise",
             std::to_string(control_read),
             std::to_string(kill_after.count()),
             std::to_string(ignored),
             "--"};
  im.args.insert(im.args.end(), command.begin(), command.end());
  for (auto& a : im.args)
    im.argv.push_back(a.data());
  im.argv.push_back(nullptr);
  return im;
}

// The descriptors open now (/proc/self/fd).
std::vector<int> open_fds() {
  std::vector<int> out;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d))
      if (e->d_name[0] >= '0' && e->d_name[0] <= '9') out.push_back(std::atoi(e->d_name));
    ::closedir(d);
  }
  return out;
}

// The descriptors dblock was started with (run_exec() reads them before it opens anything): the
// command inherits these, as from any program; none that dblock opened itself (its database
// connections), whatever their close-on-exec flag.
std::vector<int> inherited_fds;  // remember_inherited_fds()

// The signal dispositions start_command() replaced, which wait_command() puts back.
std::vector<std::pair<int, struct sigaction>> replaced_dispositions;

}  // namespace

void remember_inherited_fds() {
  inherited_fds = open_fds();
}

// Starts the supervisor, which starts the command (supervise.cpp), and passes the signals of
// forwarded_signals() on to it. dblock becomes a child subreaper too: should the supervisor die
// alone, the command's processes are re-parented here and end_tree() finds them.
pid_t start_command(const std::vector<std::string>& command, const std::vector<std::string>& vars,
                    milliseconds kill_after) {
  // The signals ignored when dblock started (nohup's SIGHUP) stay ignored for the command.
  unsigned long long ignored = 0;
  std::vector<int> kept = forwarded_signals();
  kept.insert(kept.end(), {SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU});
  for (int sig : kept) {
    struct sigaction old {};
    if (sig <= 64 && sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN)
      ignored |= 1ULL << (sig - 1);
  }
  // The pipe first: a signal that comes while the supervisor starts waits in it.
  int ctl[2];
  if (::pipe2(ctl, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  control_fd = ctl[1];
  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  std::vector<int> replaced = forwarded_signals();
  replaced.insert(replaced.end(), {SIGTTOU, SIGTTIN});
  for (int sig : replaced) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0) replaced_dispositions.emplace_back(sig, old);
  }
  for (int sig : forwarded_signals())
    sigaction(sig, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a write to a supervisor that is gone fails with EPIPE instead
  // The command may get the terminal: dblock, in the background then, still writes its messages
  // (with `stty tostop` a write would stop it, watchdog and all).
  ::signal(SIGTTOU, SIG_IGN);
  ::signal(SIGTTIN, SIG_IGN);
  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);

  const command_image im = make_image(command, vars, ctl[0], kill_after, ignored);
  std::vector<int> own;  // dblock's own descriptors: not for the command
  for (int fd : open_fds())
    if (fd > STDERR_FILENO && fd != ctl[0] &&
        std::find(inherited_fds.begin(), inherited_fds.end(), fd) == inherited_fds.end())
      own.push_back(fd);
  sigset_t forwarded;
  sigemptyset(&forwarded);
  for (int sig : forwarded_signals())
    sigaddset(&forwarded, sig);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The forked child of a process with threads: async-signal-safe calls only until execve.
    // The supervisor takes these signals blocked, from its first instruction on (it keeps them
    // so: its orders come through the pipe), and the command unblocks them.
    ::sigprocmask(SIG_BLOCK, &forwarded, nullptr);
    for (int fd : own)
      ::close(fd);
    ::fcntl(ctl[0], F_SETFD, 0);
    ::execve("/proc/self/exe", im.argv.data(), im.envp.data());
    const char msg[] = "dblock exec: cannot start the supervisor (/proc/self/exe)\n";
    (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
    ::_exit(exit_software);
  }
  ::close(ctl[0]);
  return pid;
}

// Waits for the supervisor; its exit status is the command's (128+N when a signal N ended it).
// A supervisor killed by a signal leaves the command's processes to dblock, which ends them.
int wait_command(pid_t pid, milliseconds kill_after) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  if (WIFEXITED(status)) {
    // The command and its tree are gone: no more orders (the pipe stays open: a late on_lost
    // may still hold its number; SIGPIPE stays ignored), and a signal now is dblock's own again
    // (while it releases).
    control_fd = -1;
    for (const auto& [sig, old] : replaced_dispositions)
      sigaction(sig, &old, nullptr);
    replaced_dispositions.clear();
    return WEXITSTATUS(status);
  }
  std::cerr << "dblock exec: the command's supervisor (pid " << pid << ") was killed by signal "
            << WTERMSIG(status) << "; ending the command's processes\n";
  end_tree(::getpid(), kill_after, [] {
    int st = 0;
    while (::waitpid(-1, &st, WNOHANG) > 0) {
    }
  });
  return exit_software;
}

}  // namespace dblock::cli
