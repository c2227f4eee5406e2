// dblock bench: the benchmark suite of bench/suite/, on its own tables (prefix dblock_bench_
// unless given), never the production lock table.
#include <iostream>

#include "commands.hpp"
#include "dialect/dialect.hpp"

namespace dblock::cli {

CLI::App* add_bench(CLI::App& app, common_options& common, bench_options& b) {
  auto& o = b.suite;
  auto* bench = app.add_subcommand(
      "bench", "benchmark suite: dblock against the raw-SQL floor and the alternatives");
  bench->add_option("--url", b.urls,
                    "database URL, repeatable: one per backend to measure (default $DBLOCK_URL)");
  bench->add_option("--table-prefix", common.prefix,
                    "prefix of the benchmark's tables (default dblock_bench_)");
  bench->add_flag("-v,--verbose", common.verbose, "say more on stderr");
  bench->add_option("--seconds", o.seconds, "seconds per measurement")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  bench->add_option("--clients", o.clients, "client counts (threads, own connections)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',');
  bench
      ->add_option("--rounds", o.repeat,
                   "rounds of every measurement; each figure is the median over them")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  bench->add_option(
      "--only", o.only,
      "run only the operations whose name contains this, or one of these comma-separated "
      "parts (e.g. lease, handoff, dblock.lease,semaphore); a part =NAME selects that "
      "operation alone (e.g. =dblock.handoff, without dblock.handoff_fair)");
  bench->add_option("--redis", o.redis,
                    "HOST:PORT of a throwaway redis-server for the Redis comparison");
  bench->add_option("--json", o.json_path, "write the results as JSON (bench/README.md)");
  bench->add_option("--plot", o.plot_path,
                    "draw throughput against clients into this SVG file (needs gnuplot)");
  bench->add_option("--keys", o.keys, "distinct keys per client for spread operations")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  bench
      ->add_option("--poll-max-ms", o.poll_max_ms,
                   "lease_options::poll_max of the waiting acquires (0: the library default)")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  bench->add_flag("--listener-per-handle", o.listener_per_handle,
                  "PostgreSQL: one wake-up listener per database handle instead of one per host "
                  "(database_options::share_listener = false)");
  bench
      ->add_option("--hold-us", o.hold_us,
                   "how long a holder keeps the lock in the handoff measurement (µs)")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  bench
      ->add_option("--leases", o.watchdog_leases,
                   "leases held with the watchdog by dblock.watchdog (run when --only names it)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  bench
      ->add_option("--leases-ttl-ms", o.watchdog_ttl_ms,
                   "TTL of dblock.watchdog's leases (ms); they are held for three TTLs")
      ->check(CLI::Range(300, 600000))
      ->capture_default_str();
  return bench;
}

int run_bench(const common_options& c, const bench_options& b) {
  dblock::bench::options o = b.suite;
  o.urls = b.urls;
  if (o.urls.empty()) o.urls.push_back(url_or_env(""));
  if (!c.prefix.empty()) o.prefix = c.prefix;
  dblock::detail::make_table_names(o.prefix);  // validates the prefix
  return dblock::bench::run(o, std::cout, std::cerr);
}

}  // namespace dblock::cli
