// The supervisor of `dblock exec`'s command, and the process-tree helpers it shares with exec.cpp.
//
// dblock exec (holding the lease, its watchdog on threads of its own) starts the supervisor as
// `/proc/self/exe __supervise CTL KILL_AFTER_MS IGNORED -- CMD...`, a fresh single-threaded
// process in a process group of its own; the supervisor is a child subreaper
// (PR_SET_CHILD_SUBREAPER), so every process below it that loses its parent, a double-forked
// daemon included, is re-parented to it and stays in the tree it can find and end. It starts the
// command in a process group of its own (the terminal's foreground group when dblock had the
// terminal) and takes orders from dblock only, over the control pipe CTL:
//   byte 0        the lease is lost: end the tree (SIGTERM, SIGKILL after KILL_AFTER_MS)
//   byte N > 0    forward signal N to every process of the tree
//   end of file   dblock is gone (by any signal, SIGKILL included, since the kernel closes a dead
//                 process's descriptors): nobody renews the lease any more, end the tree
// When the command ends, processes it left behind are ended as well: the lease never ends while
// a process of the tree runs. The supervisor exits with the command's status (128+N if a signal
// N ended it) once no process of the tree is left.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tree.hpp"

namespace dblock::cli {

namespace {

using steady = std::chrono::steady_clock;

struct proc_entry {
  pid_t pid;
  pid_t ppid;
  bool zombie;
};

// Every process of the system from /proc/N/stat: "pid (comm) state ppid ...", where comm may hold
// spaces and parentheses, so the fields are read after its last ')'.
std::vector<proc_entry> all_processes() {
  std::vector<proc_entry> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;  // gone meanwhile
    const auto close = line.rfind(')');
    if (close == std::string::npos || close + 4 > line.size()) continue;
    const char state = line[close + 2];
    const long ppid = std::strtol(line.c_str() + close + 4, nullptr, 10);
    out.push_back({static_cast<pid_t>(pid), static_cast<pid_t>(ppid), state == 'Z'});
  }
  ::closedir(d);
  return out;
}

}  // namespace

const std::vector<int>& forwarded_signals() {
  static const std::vector<int> all = [] {
    std::vector<int> s = {SIGHUP,  SIGINT,  SIGQUIT, SIGTERM,   SIGUSR1, SIGUSR2, SIGALRM,
                          SIGXCPU, SIGXFSZ, SIGIO,   SIGVTALRM, SIGPROF, SIGPWR};
    for (int r = SIGRTMIN; r <= SIGRTMAX; ++r)
      s.push_back(r);
    return s;
  }();
  return all;
}

std::vector<pid_t> live_descendants(pid_t root) {
  const auto procs = all_processes();
  std::unordered_multimap<pid_t, const proc_entry*> children;
  for (const auto& p : procs)
    children.emplace(p.ppid, &p);
  std::vector<pid_t> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    const pid_t parent = todo.back();
    todo.pop_back();
    auto range = children.equal_range(parent);
    for (auto it = range.first; it != range.second; ++it) {
      const proc_entry* c = it->second;
      if (c->pid == root) continue;
      if (!c->zombie) out.push_back(c->pid);
      todo.push_back(c->pid);
    }
  }
  return out;
}

std::size_t signal_tree(pid_t root, int sig, bool wake) {
  const auto pids = live_descendants(root);
  for (pid_t p : pids) {
    ::kill(p, sig);
    if (wake) ::kill(p, SIGCONT);
  }
  return pids.size();
}

std::size_t end_tree(pid_t root, std::chrono::milliseconds kill_after,
                     const std::function<void()>& reap) {
  const std::size_t first = signal_tree(root, SIGTERM, true);
  const auto kill_at = steady::now() + kill_after;
  for (;;) {
    if (reap) reap();
    if (live_descendants(root).empty()) return first;
    if (steady::now() >= kill_at) signal_tree(root, SIGKILL, false);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

namespace {

[[noreturn]] void run_command(char** cmd, bool foreground, unsigned long long ignored) {
  // In the forked child of the single-threaded supervisor.
  ::setpgid(0, 0);
  if (foreground) ::tcsetpgrp(STDIN_FILENO, ::getpid());  // SIGTTOU is still ignored here
  // Dispositions as dblock found them: a signal ignored there (nohup's SIGHUP) stays ignored.
  std::vector<int> reset = forwarded_signals();
  reset.insert(reset.end(), {SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU, SIGCHLD});
  for (int s : reset)
    ::signal(s, s <= 64 && (ignored >> (s - 1) & 1ULL) ? SIG_IGN : SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvp(cmd[0], cmd);
  const int err = errno;
  std::cerr << "dblock exec: cannot run '" << cmd[0]
            << (err == ENOENT ? "': not found\n" : "': cannot execute\n");
  std::_Exit(err == ENOENT ? 127 : 126);
}

}  // namespace

namespace {

using std::chrono::milliseconds;

// The supervisor's state and its steps (supervise_main() runs them).
class supervisor {
 public:
  supervisor(int ctl, milliseconds kill_after)
      : ctl_(ctl), kill_after_(kill_after), self_(::getpid()), dblock_pid_(::getppid()) {}

  // Subreaper, signals, the terminal and the command (in a group of its own). False when the
  // command could not be started.
  bool start(char** cmd, unsigned long long ignored) {
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    // Orders come from dblock over CTL only: the signals it forwards are blocked here (dblock's
    // forked child blocked them before it became the supervisor, so none is lost or acted on in
    // between; the command unblocks them, and one sent to it before it did waits for it), and
    // the children are watched through a signalfd.
    sigset_t blocked;
    sigemptyset(&blocked);
    for (int s : forwarded_signals())
      sigaddset(&blocked, s);
    sigaddset(&blocked, SIGCHLD);
    ::sigprocmask(SIG_BLOCK, &blocked, nullptr);
    for (int s : {SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU})
      ::signal(s, SIG_IGN);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sfd_ = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);  // -1: polls every 20 ms
    ::fcntl(ctl_, F_SETFD, FD_CLOEXEC);                        // the command must not hold it
    // The terminal, when dblock has it, goes to the command's group (as a shell does), so that
    // a command reading it is not stopped and the terminal's Ctrl-C reaches it directly.
    dblock_group_ = ::getpgrp();
    foreground_ = ::isatty(STDIN_FILENO) && ::tcgetpgrp(STDIN_FILENO) == dblock_group_;
    // A group of its own: a signal to dblock's process group (kill -9 -PGID) does not reach
    // the supervisor, which then ends the tree.
    ::setpgid(0, 0);
    command_ = ::fork();
    if (command_ < 0) {
      std::cerr << "dblock exec: cannot start the command: fork: " << std::strerror(errno) << "\n";
      return false;
    }
    if (command_ == 0) run_command(cmd, foreground_, ignored);
    ::setpgid(command_, command_);  // both sides, as shells do; fails harmlessly after its exec
    if (foreground_) ::tcsetpgrp(STDIN_FILENO, command_);
    return true;
  }

  // Until the command and every process of its tree are gone; the command's status.
  int run() {
    for (;;) {
      reap();
      if (done_ && finished()) break;
      if (ending_ && steady::now() >= kill_at_) kill_rest();
      wait_and_read();
    }
    if (foreground_) ::tcsetpgrp(STDIN_FILENO, dblock_group_);  // SIGTTOU is ignored here
    return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
  }

 private:
  void reap() {
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(-1, &st, WNOHANG)) > 0)
      if (r == command_) {
        done_ = true;
        status_ = st;
      }
  }

  void start_ending() {
    if (ending_) return;
    ending_ = true;
    signal_tree(self_, SIGTERM, true);
    kill_at_ = steady::now() + kill_after_;
  }

  // After the command ended: true once nothing of its tree is left (two empty scans in a row:
  // one may miss a child whose parent exits meanwhile); ends what it left behind.
  bool finished() {
    const auto left = live_descendants(self_);
    if (left.empty()) return ++empty_scans_ >= 2;
    empty_scans_ = 0;
    if (!ending_) {
      std::cerr << "dblock exec: the command ended and left " << left.size()
                << " process(es) running; sending them SIGTERM (the lease is released only "
                   "when none is left)\n";
      start_ending();
    }
    return false;
  }

  void kill_rest() {
    const std::size_t n = signal_tree(self_, SIGKILL, false);
    if (n > 0 && !warned_ && steady::now() >= kill_at_ + std::chrono::seconds(5)) {
      warned_ = true;
      std::cerr << "dblock exec: warning: " << n
                << " process(es) of the command still run 5 s after SIGKILL (in uninterruptible "
                   "sleep, or not ours to signal)\n";
    }
  }

  // Waits for a child's end or an order (every 20 ms while ending), and acts on the orders.
  void wait_and_read() {
    pollfd fds[2] = {{ctl_, POLLIN, 0}, {sfd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, ending_ || done_ || sfd_ < 0 ? 20 : -1);
    if (n < 0 && errno != EINTR) std::this_thread::sleep_for(milliseconds(20));
    if (n <= 0) return;
    if (fds[1].revents) {
      signalfd_siginfo si;
      while (::read(sfd_, &si, sizeof si) > 0) {
      }
    }
    if (ctl_ < 0 || !fds[0].revents) return;
    unsigned char order[64];
    const ssize_t got = ::read(ctl_, order, sizeof order);
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
      ::close(ctl_);
      ctl_ = -1;
      if (!done_) {
        std::cerr << "dblock exec: dblock (pid " << dblock_pid_
                  << ") ended while the command ran; nobody renews the lease: sending the "
                     "command's processes SIGTERM (SIGKILL after "
                  << kill_after_.count() << " ms)\n";
        start_ending();
      }
    }
    for (ssize_t i = 0; i < got; ++i) {
      if (order[i] == 0)
        start_ending();
      else
        signal_tree(self_, order[i], false);
    }
  }

  int ctl_;
  const milliseconds kill_after_;
  const pid_t self_, dblock_pid_;
  pid_t command_ = -1, dblock_group_ = 0;
  int sfd_ = -1;
  bool foreground_ = false, done_ = false, ending_ = false, warned_ = false;
  int status_ = 0, empty_scans_ = 0;
  steady::time_point kill_at_ = steady::time_point::max();
};

}  // namespace

int supervise_main(int argc, char** argv) {
  if (argc < 7 || std::strcmp(argv[5], "--") != 0) {
    std::cerr << "dblock: __supervise is started by `dblock exec`, not by hand\n";
    return 64;
  }
  supervisor s(std::atoi(argv[2]), milliseconds(std::atoll(argv[3])));
  if (!s.start(argv + 6, std::strtoull(argv[4], nullptr, 10))) return 70;
  return s.run();
}

}  // namespace dblock::cli
