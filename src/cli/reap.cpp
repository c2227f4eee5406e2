// dblock reap: delete lease rows that expired long ago, in batches.
#include <nlohmann/json.hpp>

#include <iostream>

#include "commands.hpp"

namespace dblock::cli {

CLI::App* add_reap(CLI::App& app, common_options& common, reap_options& r) {
  auto* reap = app.add_subcommand("reap", "delete lease rows that expired long ago, in batches");
  add_common(reap, common);
  reap->add_option("--retention", r.retention, "delete rows expired more than this long ago")
      ->capture_default_str();
  reap->add_option("--batch", r.batch, "rows per delete transaction (1..10000)")
      ->capture_default_str();
  reap->add_option("--grace", r.grace,
                   "pause between raising the fence floor and deleting (keeps fences monotonic)")
      ->capture_default_str();
  reap->add_flag("--json", r.json, "print JSON instead of text");
  return reap;
}

int run_reap(const common_options& c, const reap_options& ro) {
  const std::string& retention = ro.retention;
  auto db = open_db(c);
  dblock::reaper_options o;
  o.retention = parse_duration(retention, "--retention");
  o.floor_grace = parse_duration(ro.grace, "--grace");
  o.batch_size = ro.batch;
  auto last_report = std::chrono::steady_clock::now();
  o.on_batch = [&](const dblock::reap_result& r) {
    // Progress on long runs: at most one line a second, on stderr.
    auto now = std::chrono::steady_clock::now();
    if (now - last_report >= std::chrono::seconds(1) || c.verbose) {
      std::cerr << "dblock reap: " << r.rows_reaped << " rows in " << r.batches << " batches, "
                << r.elapsed.count() / 1000 << " ms\n";
      last_report = now;
    }
  };
  auto r = dblock::reap_once(db, o);
  double secs = static_cast<double>(r.elapsed.count()) / 1e6;
  if (ro.json) {
    std::cout << nlohmann::json{{"version", dblock::version()},
                                {"rows_reaped", r.rows_reaped},
                                {"batches", r.batches},
                                {"elapsed_ms", r.elapsed.count() / 1000},
                                {"complete", r.complete},
                                {"runs_reaped", r.runs_reaped},
                                {"retention", retention}}
                     .dump(2)
              << "\n";
    return exit_ok;
  }
  std::cout << "reaped " << r.rows_reaped << " rows expired more than " << retention << " ago in "
            << r.batches << " batches, " << static_cast<long long>(secs * 1000) << " ms ("
            << (secs > 0 ? static_cast<long long>(r.rows_reaped / secs) : 0) << " rows/s)"
            << (r.complete ? "" : "; stopped early, rows remain") << "; " << r.runs_reaped
            << " runs of periodic jobs\n";
  return exit_ok;
}

}  // namespace dblock::cli
