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

int supervise_main(int argc, char** argv) {
  if (argc < 7 || std::strcmp(argv[5], "--") != 0) {
    std::cerr << "dblock: __supervise is started by `dblock exec`, not by hand\n";
    return 64;
  }
  int ctl = std::atoi(argv[2]);
  const std::chrono::milliseconds kill_after(std::atoll(argv[3]));
  const unsigned long long ignored = std::strtoull(argv[4], nullptr, 10);
  char** cmd = argv + 6;
  const pid_t self = ::getpid();
  const pid_t dblock_pid = ::getppid();

  ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  // Orders come from dblock over CTL only: signals sent to the supervisor itself (a terminal's,
  // or a signal to dblock's process group) are ignored, and the children are watched through a
  // signalfd.
  for (int s : forwarded_signals())
    ::signal(s, SIG_IGN);
  for (int s : {SIGPIPE, SIGTSTP, SIGTTIN, SIGTTOU})
    ::signal(s, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);
  const int sfd = ::signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  ::fcntl(ctl, F_SETFD, FD_CLOEXEC);  // the command must not hold it open

  // The terminal, when dblock has it, goes to the command's group (as a shell does), so that a
  // command reading it is not stopped and the terminal's Ctrl-C reaches it directly.
  const pid_t dblock_group = ::getpgrp();
  const bool foreground = ::isatty(STDIN_FILENO) && ::tcgetpgrp(STDIN_FILENO) == dblock_group;
  // A group of its own: a signal to dblock's process group (kill -9 -PGID) does not reach the
  // supervisor, which then ends the tree.
  ::setpgid(0, 0);

  const pid_t command = ::fork();
  if (command < 0) {
    std::cerr << "dblock exec: cannot start the command: fork: " << std::strerror(errno) << "\n";
    return 70;
  }
  if (command == 0) run_command(cmd, foreground, ignored);
  ::setpgid(command, command);  // both sides, as shells do; fails harmlessly after its exec
  if (foreground) ::tcsetpgrp(STDIN_FILENO, command);

  bool done = false;
  int status = 0;
  bool ending = false, warned = false;
  auto kill_at = steady::time_point::max();
  auto reap = [&] {
    int st = 0;
    pid_t r;
    while ((r = ::waitpid(-1, &st, WNOHANG)) > 0)
      if (r == command) {
        done = true;
        status = st;
      }
  };
  auto start_ending = [&] {
    if (ending) return;
    ending = true;
    signal_tree(self, SIGTERM, true);
    kill_at = steady::now() + kill_after;
  };
  for (;;) {
    reap();
    if (done) {
      const auto left = live_descendants(self);
      if (left.empty()) break;
      if (!ending) {
        std::cerr << "dblock exec: the command ended and left " << left.size()
                  << " process(es) running; sending them SIGTERM (the lease is released only "
                     "when none is left)\n";
        start_ending();
      }
    }
    if (ending && steady::now() >= kill_at) {
      const std::size_t n = signal_tree(self, SIGKILL, false);
      if (n > 0 && !warned && steady::now() >= kill_at + std::chrono::seconds(5)) {
        warned = true;
        std::cerr << "dblock exec: warning: " << n
                  << " process(es) of the command still run 5 s after SIGKILL (in uninterruptible "
                     "sleep, or not ours to signal)\n";
      }
    }
    pollfd fds[2] = {{ctl, POLLIN, 0}, {sfd, POLLIN, 0}};
    const int n = ::poll(fds, 2, ending || done ? 20 : -1);
    if (n < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (n <= 0) continue;
    if (fds[1].revents) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof si) > 0) {
      }
    }
    if (ctl >= 0 && fds[0].revents) {
      unsigned char order[64];
      const ssize_t got = ::read(ctl, order, sizeof order);
      if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
        ::close(ctl);
        ctl = -1;
        if (!done) {
          std::cerr << "dblock exec: dblock (pid " << dblock_pid
                    << ") ended while the command ran; nobody renews the lease: sending the "
                       "command's processes SIGTERM (SIGKILL after "
                    << kill_after.count() << " ms)\n";
          start_ending();
        }
      }
      for (ssize_t i = 0; i < got; ++i) {
        if (order[i] == 0)
          start_ending();
        else
          signal_tree(self, order[i], false);
      }
    }
  }
  if (foreground) ::tcsetpgrp(STDIN_FILENO, dblock_group);  // SIGTTOU is ignored here
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace dblock::cli
