// dblock's benchmark suite (run by dblock-bench, bench/main.cpp): lock costs as a ratio to the
// database's own floor, measured side by side in one run, and against what users pick instead.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

namespace dblock::bench {

/// What to measure.
struct options {
  std::vector<std::string> urls;         ///< one database URL per backend to measure
  std::vector<int> clients{1, 4, 16};    ///< client counts (threads, each with its own connection)
  double seconds = 1;                    ///< per measurement, after a warm-up of a tenth of it
  int repeat = 3;                        ///< rounds; each figure is the median over the rounds
  std::string redis;                     ///< host:port of a throwaway redis-server; empty: skipped
  std::string only;                      ///< run only operations whose name contains this
  std::string prefix = "dblock_bench_";  ///< table prefix of the benchmark's own tables
  std::string json_path;                 ///< --output: the results as JSON (bench/results/ format)
  std::string plot_path;                 ///< draw throughput against clients here (SVG, gnuplot)
  int keys = 1000;                       ///< distinct keys per client for the spread operations
  int hold_us = 1000;                    ///< how long a holder keeps the lock in the handoff test
  int watchdog_leases = 10000;           ///< leases held with the watchdog by dblock.watchdog
  int watchdog_ttl_ms = 3000;            ///< their TTL; they are held for three TTLs
  int poll_max_ms = 0;  ///< lease_options::poll_max for waiting acquires; 0: default
  /// database_options::share_listener = false: a PostgreSQL listener per handle, not per host
  bool listener_per_handle = false;
  /// Fair waiters take a freed lease themselves, never handed over in the release (to measure
  /// the handover against its removal; detail::set_handover_enabled(false))
  bool no_handover = false;
};

/// Runs the suite: progress on `progress`, the table on `out`. Returns a process exit status.
int run(const options& o, std::ostream& out, std::ostream& progress);

}  // namespace dblock::bench
