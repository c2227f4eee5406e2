// The suite's timing loop: threads that each repeat one operation for a measurement window after
// a warm-up, and the figures of a measurement (one row of the results).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dblock::bench {

using clk = std::chrono::steady_clock;

/// One thread's operation: returns true when it succeeded (only successes are counted).
using cycle_fn = std::function<bool()>;
/// Builds one thread's operation (and its own connection) for thread `i`.
using setup_fn = std::function<cycle_fn(int i)>;

struct result {
  std::string backend;  ///< postgresql, mysql, sqlite, redis
  std::string label;    ///< the backend as the table names it (backend_ctx::label)
  std::string operation, kind, floor, note;
  int clients = 0;
  double per_second = 0, p50_us = 0, p99_us = 0;
  long long operations = 0, successes = 0, errors = 0;
  int rounds = 1;
  std::string first_error;
  std::optional<double> ratio;
  /// Handoff rows: waiters woken per release, and the longest acquire wait over the mean one.
  std::optional<double> woken_per_release, fairness;
  double wait_mean_us = 0, wait_max_us = 0;  ///< handoff rows: acquire() waits
  std::map<std::string, double> figures;     ///< further named figures (the watchdog rows)
  /// Requests sent per operation by the measuring threads (round_trips.hpp): round trips.
  std::optional<double> round_trips;
};

/// The value below which a share `q` of `v` lies (0 when `v` is empty); reorders `v`.
double percentile(std::vector<float>& v, double q);

/// The end of the measurement the calling thread takes part in (set by measure() for its threads).
extern thread_local clk::time_point measurement_end;
/// When the measuring thread's window starts (after the warm-up): figures that a cycle records
/// itself (handoff latencies, waits) count only from then.
extern thread_local clk::time_point measurement_start;

/// Runs `clients` threads for `seconds` (after a warm-up of a tenth of it, at least 0.1 s but not
/// longer than the measurement itself) and reports successful operations per second and the
/// latency of every operation.
result measure(int clients, double seconds, const setup_fn& setup);

/// A random owner token of 32 hex digits.
std::string token();
/// A name no earlier measurement used (leases held for a whole measurement are not released).
std::string fresh_name(const std::string& what);
/// A random integer in [0, n).
int rand_below(int n);

}  // namespace dblock::bench
