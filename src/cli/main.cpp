// The dblock command-line tool: migrate the schema, and guard commands with a lease lock.
// This file declares the app and dispatches to the subcommands (commands.hpp, one file each).
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>

#include "commands.hpp"
#include "tree.hpp"

using namespace dblock::cli;

namespace {

// Every subcommand's options, and its CLI11 subcommand once declared.
struct subcommands {
  migrate_options migrate;
  reap_options reap;
  status_options status;
  release_options release;
  row_mode_options row_mode;
  exec_options exec;
  id_options id;
  leader_options leader;
  runs_options runs;
  CLI::App* migrate_cmd = nullptr;
  CLI::App* reap_cmd = nullptr;
  CLI::App* status_cmd = nullptr;
  CLI::App* release_cmd = nullptr;
  CLI::App* row_mode_cmd = nullptr;
  CLI::App* exec_cmd = nullptr;
  CLI::App* id_cmd = nullptr;
  CLI::App* leader_cmd = nullptr;
  CLI::App* runs_cmd = nullptr;
};

// The subcommands in the order `dblock --help` lists them.
void add_subcommands(CLI::App& app, common_options& common, subcommands& s) {
  s.migrate_cmd = add_migrate(app, common, s.migrate);
  s.reap_cmd = add_reap(app, common, s.reap);
  s.status_cmd = add_status(app, common, s.status);
  s.release_cmd = add_release(app, common, s.release);
  s.row_mode_cmd = add_row_mode(app, common, s.row_mode);
  s.exec_cmd = add_exec(app, common, s.exec);
  s.runs_cmd = add_runs(app, common, s.runs);
  s.id_cmd = add_id(app, common, s.id);
  s.leader_cmd = add_leader(app, common, s.leader);
}

// An error that ended the subcommand: a line on stderr and, for a subcommand run with --json, an
// object on stdout as well, {"version", "error": {"kind", "message", "exit_status"}}, so that a
// caller parsing the output gets an answer either way. Returns `status`.
int report_error(const subcommands& s, const std::string& message, const char* kind, int status) {
  std::cerr << "dblock: " << shown(message) << "\n";
  const bool json =
      (s.migrate_cmd->parsed() && s.migrate.json) || (s.reap_cmd->parsed() && s.reap.json) ||
      (s.status_cmd->parsed() && s.status.json) || (s.leader_cmd->parsed() && s.leader.json) ||
      (s.runs_cmd->parsed() && s.runs.json);
  if (json)
    std::cout << nlohmann::json{{"version", dblock::version()},
                                {"error",
                                 {{"kind", kind}, {"message", message}, {"exit_status", status}}}}
                     .dump(2)
              << "\n";
  return status;
}

// Runs the subcommand that was given; errors become a message on stderr and an exit status.
int dispatch(const common_options& common, const subcommands& s) {
  try {
    if (s.migrate_cmd->parsed()) return run_migrate(common, s.migrate);
    if (s.exec_cmd->parsed()) return run_exec(common, s.exec);
    if (s.reap_cmd->parsed()) return run_reap(common, s.reap);
    if (s.status_cmd->parsed()) return run_status(common, s.status);
    if (s.release_cmd->parsed()) return run_release(common, s.release);
    if (s.row_mode_cmd->parsed()) return run_row_mode(common, s.row_mode);
    if (s.id_cmd->parsed()) return run_id(common, s.id);
    if (s.leader_cmd->parsed()) return run_leader(common, s.leader);
    if (s.runs_cmd->parsed()) return run_runs(common, s.runs);
  } catch (const dblock::error& e) {
    return report_error(s, e.what(), dblock::to_string(e.kind()), exit_status_for(e));
  } catch (const std::exception& e) {
    return report_error(s, e.what(), "internal", exit_software);
  }
  return exit_usage;
}

}  // namespace

int main(int argc, char** argv) {
  // The supervisor of `dblock exec`'s command: a process of its own, started by exec.cpp.
  if (argc > 1 && std::strcmp(argv[1], "__supervise") == 0)
    return dblock::cli::supervise_main(argc, argv);
  common_options common;
  CLI::App app{"dblock: distributed locks on PostgreSQL, MySQL/MariaDB and SQLite"};
  app.require_subcommand(1);
  app.add_flag("-v,--verbose", common.verbose, "say more on stderr (also after the subcommand)");
  app.set_version_flag("--version", std::string("dblock ") + dblock::version());
  app.footer(
      "Exit statuses: 0 ok; 1 release: no such lock, row-mode: not in session mode, leader:\n"
      "no leader, migrate --dry-run: migrations pending; 64 usage or invalid argument; 69 cannot "
      "connect; 70 internal error\n"
      "or outcome unknown (in doubt); 75 lock not acquired; 79 lease lost while the command\n"
      "ran; 78 schema missing or mismatched. `exec` otherwise exits with the command's status\n"
      "(128+N if killed by signal N).");
  subcommands s;
  add_subcommands(app, common, s);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }
  const int rc = dispatch(common, s);
  // Every handle is gone by now, but a connect the library stopped waiting for at a deadline
  // (a failover, a frozen server) may still be finishing on a thread of its own, and the exit
  // handlers (OpenSSL's among them) must not run under it: end here, output flushed.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(rc);
}
