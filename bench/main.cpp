// dblock-bench: the benchmark suite of bench/suite/ (bench/README.md), on its own tables (prefix
// dblock_bench_ unless given), never the production lock table. A program of its own, built with
// -DDBLOCK_BENCH=ON and never installed: the dblock tool links neither the suite nor hiredis.
// Exit statuses: 0 ok, 64 usage or invalid argument, 70 any other error (as the dblock tool).
#include <CLI/CLI.hpp>
#include <dblock/dblock.hpp>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "dialect/dialect.hpp"
#include "suite.hpp"

namespace {

constexpr int exit_usage = 64;     // EX_USAGE
constexpr int exit_software = 70;  // EX_SOFTWARE

// Declares the options of the suite on `app`; the URLs go to `urls`, the prefix to `prefix`.
void add_options(CLI::App& app, dblock::bench::options& o, std::vector<std::string>& urls,
                 std::string& prefix) {
  app.add_option("--url", urls,
                 "database URL, repeatable: one per backend to measure (default $DBLOCK_URL)");
  app.add_option("--table-prefix", prefix,
                 "prefix of the benchmark's tables (default dblock_bench_)");
  app.add_option("--seconds", o.seconds, "seconds per measurement")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  app.add_option("--clients", o.clients, "client counts (threads, own connections)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',');
  app.add_option("--rounds", o.repeat,
                 "rounds of every measurement; each figure is the median over them")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option(
      "--only", o.only,
      "run only the operations whose name contains this, or one of these comma-separated "
      "parts (e.g. lease, handoff, dblock.lease,semaphore); a part =NAME selects that "
      "operation alone (e.g. =dblock.handoff, without dblock.handoff_fair)");
  app.add_option("--redis", o.redis,
                 "HOST:PORT of a throwaway redis-server for the Redis comparison");
  app.add_option("--output", o.json_path, "write the results to this JSON file (bench/README.md)");
  app.add_option("--plot", o.plot_path,
                 "draw throughput against clients into this SVG file (needs gnuplot)");
  app.add_option("--keys", o.keys, "distinct keys per client for spread operations")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--poll-max-ms", o.poll_max_ms,
                 "lease_options::poll_max of the waiting acquires (0: the library default)")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_flag("--listener-per-handle", o.listener_per_handle,
               "PostgreSQL: one wake-up listener per database handle instead of one per host "
               "(database_options::share_listener = false)");
  app.add_flag("--no-handover", o.no_handover,
               "fair waiters take a freed lease themselves instead of being handed it in the "
               "release (PostgreSQL, SQLite), to measure the handover against its removal");
  app.add_option("--hold-us", o.hold_us,
                 "how long a holder keeps the lock in the handoff measurement (µs)")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();
  app.add_option("--leases", o.watchdog_leases,
                 "leases held with the watchdog by dblock.watchdog (run when --only names it)")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--leases-ttl-ms", o.watchdog_ttl_ms,
                 "TTL of dblock.watchdog's leases (ms); they are held for three TTLs")
      ->check(CLI::Range(300, 600000))
      ->capture_default_str();
}

int run(dblock::bench::options o, const std::vector<std::string>& urls, const std::string& prefix) {
  o.urls = urls;
  if (o.urls.empty()) {
    const char* env = std::getenv("DBLOCK_URL");
    if (!env || !*env) {
      std::cerr << "dblock-bench: no database URL: pass --url or set DBLOCK_URL\n";
      return exit_usage;
    }
    o.urls.emplace_back(env);
  }
  if (!prefix.empty()) o.prefix = prefix;
  dblock::detail::make_table_names(o.prefix);  // validates the prefix
  return dblock::bench::run(o, std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dblock-bench: dblock against the raw-SQL floor and the alternatives"};
  dblock::bench::options o;
  std::vector<std::string> urls;
  std::string prefix;
  add_options(app, o, urls, prefix);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : exit_usage;
  }
  try {
    return run(o, urls, prefix);
  } catch (const dblock::error& e) {
    std::cerr << "dblock-bench: " << e.what() << "\n";
    return e.code() == dblock::errc::invalid_argument ? exit_usage : exit_software;
  } catch (const std::exception& e) {
    std::cerr << "dblock-bench: " << e.what() << "\n";
    return exit_software;
  }
}
