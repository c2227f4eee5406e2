// The process tree of a command run by `dblock exec`: finding every process below a root (the
// supervisor, or dblock itself after the supervisor died) and ending them all. Used by the
// supervisor (supervise.cpp) and by exec.cpp's fallback; Linux only (/proc, subreapers).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <vector>

namespace dblock::cli {

/// The signals `dblock exec` forwards to the command's tree (every catchable signal whose default
/// action ends a process, but SIGPIPE, which only dblock's own writes raise).
const std::vector<int>& forwarded_signals();

/// Every process below `root` (children, their children, ...) that is not a zombie, read from
/// /proc. A process orphaned below a subreaper `root` is re-parented to it and so stays found.
std::vector<pid_t> live_descendants(pid_t root);

/// Sends `sig` to every live descendant of `root` (and SIGCONT after it, when `wake`: a stopped
/// process acts on SIGTERM only once it runs). Returns how many were signalled.
std::size_t signal_tree(pid_t root, int sig, bool wake);

/// Ends the tree below `root`: SIGTERM (and SIGCONT) to every live descendant, SIGKILL to every
/// one still alive `kill_after` later (and again to any that appears after), until none is left.
/// `reap` is called between rounds to collect the children of `root` (a subreaper must reap the
/// orphans it adopts). Returns how many processes were signalled at first.
std::size_t end_tree(pid_t root, std::chrono::milliseconds kill_after,
                     const std::function<void()>& reap);

/// The hidden entry `dblock __supervise CTL_FD KILL_AFTER_MS IGNORED_MASK -- CMD...` that
/// `dblock exec` starts (exec.cpp). Returns the command's status (128+N when killed by N).
int supervise_main(int argc, char** argv);

}  // namespace dblock::cli
