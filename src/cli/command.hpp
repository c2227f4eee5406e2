// dblock's side of the supervisor that runs `dblock exec`'s command (supervise.cpp, tree.hpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace dblock::cli {

/// Records the descriptors dblock was started with, before it opens any: the command inherits
/// these, and none that dblock opened itself (its database connections).
void remember_inherited_fds();

/// Starts the supervisor, which runs `command` with `vars` added to the environment in a process
/// group of its own; the signals of forwarded_signals() that dblock gets are passed on to the
/// command's whole tree from now on. Returns the supervisor's pid.
pid_t start_command(const std::vector<std::string>& command, const std::vector<std::string>& vars,
                    std::chrono::milliseconds kill_after);

/// One order to the supervisor: 0 ends the command's tree (SIGTERM, SIGKILL after kill_after),
/// N passes signal N on to it. Async-signal-safe; nothing before start_command() or after
/// wait_command().
void tell_supervisor(unsigned char order);

/// Waits for the supervisor: the command's status (128+N when a signal N ended it). A supervisor
/// killed by a signal leaves the command's processes to dblock, which ends them (exit_software).
int wait_command(pid_t supervisor, std::chrono::milliseconds kill_after);

}  // namespace dblock::cli
