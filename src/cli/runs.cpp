// dblock runs: list the recorded runs of `exec --once` / `--every` (dblock::list_runs), or forget
// a key's successes so that it may run again (dblock::forget_runs).
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"

namespace dblock::cli {

CLI::App* add_runs(CLI::App& app, common_options& common, runs_options& r) {
  auto* runs = app.add_subcommand(
      "runs", "list the recorded runs of exec --once / --every, or --forget a key's successes");
  add_common(runs, common);
  runs->add_flag("--json", r.json, "print JSON instead of text");
  runs->add_option("--limit", r.limit, "at most this many runs, newest first")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  auto* forget = runs->add_flag(
      "--forget", r.forget,
      "forget KEY's successes (every slot): the next exec --once / --every of it runs again; "
      "the rows stay, marked with who forgot them and why");
  runs->add_option("--reason", r.reason, "with --forget: why (recorded)")->needs(forget);
  runs->add_option("key", r.key, "the --once KEY or --every lock NAME (default: every key)");
  return runs;
}

namespace {

nlohmann::json to_json(const dblock::job_run& j) {
  nlohmann::json o{{"key", j.key},
                   {"slot", j.slot},
                   {"fence", j.fence},
                   {"period_ms", j.period.count()},
                   {"host", j.host},
                   {"pid", j.pid},
                   {"started_at", iso_time(j.started_at)},
                   {"ended_at", nullptr},
                   {"exit_status", nullptr},
                   {"succeeded", j.succeeded},
                   {"forgotten_at", nullptr}};
  if (j.ended_at) o["ended_at"] = iso_time(*j.ended_at);
  if (j.exit_status) o["exit_status"] = *j.exit_status;
  if (j.forgotten_at) {
    o["forgotten_at"] = iso_time(*j.forgotten_at);
    o["forgotten_by"] = j.forgotten_by;
    o["forget_reason"] = j.forget_reason;
  }
  return o;
}

std::string outcome_of(const dblock::job_run& j) {
  if (j.forgotten_at) return "forgotten";
  if (j.succeeded) return "succeeded";
  if (j.exit_status) return "failed (" + std::to_string(*j.exit_status) + ")";
  return "running, or ended without a record";
}

}  // namespace

int run_runs(const common_options& c, const runs_options& r) {
  auto db = open_db(c);
  if (r.forget) {
    if (r.key.empty())
      throw dblock::error(dblock::errc::invalid_argument, "runs --forget needs a KEY");
    if (r.reason.empty())
      throw dblock::error(dblock::errc::invalid_argument,
                          "runs --forget needs --reason TEXT (it is recorded)");
    const char* user = std::getenv("USER");
    const long long n = dblock::forget_runs(db, r.key, r.reason, user && *user ? user : "dblock");
    if (r.json) {
      std::cout << nlohmann::json{{"version", dblock::version()}, {"key", r.key}, {"forgotten", n}}
                       .dump(2)
                << "\n";
    } else {
      std::cout << "forgot " << n << " success(es) of '" << shown(r.key)
                << "': its next run goes ahead\n";
    }
    return n > 0 ? exit_ok : exit_not_found;
  }
  const auto runs = dblock::list_runs(db, r.key, r.limit);
  if (r.json) {
    nlohmann::json j{{"version", dblock::version()}, {"runs", nlohmann::json::array()}};
    for (const auto& run : runs)
      j["runs"].push_back(to_json(run));
    std::cout << j.dump(2) << "\n";
    return exit_ok;
  }
  if (runs.empty()) {
    std::cout << "no runs recorded" << (r.key.empty() ? "" : " for '" + shown(r.key) + "'") << "\n";
    return exit_ok;
  }
  for (const auto& run : runs) {
    std::cout << shown(run.key) << "  slot " << run.slot << "  fence " << run.fence << "  "
              << shown(run.host) << ":" << run.pid << "  started " << iso_time(run.started_at);
    if (run.ended_at)
      std::cout << "  took "
                << human(std::chrono::duration_cast<std::chrono::microseconds>(*run.ended_at -
                                                                               run.started_at));
    std::cout << "  " << outcome_of(run) << "\n";
  }
  return exit_ok;
}

}  // namespace dblock::cli
