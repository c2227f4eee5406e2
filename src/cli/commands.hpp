// The subcommands of the dblock command-line tool. Each one has its options, an add_* that
// declares it on the CLI11 app (the order of the calls is the order of `dblock --help`), and a
// run_* that does it and returns the exit status (errors it does not handle are thrown).
#pragma once

#include <CLI/CLI.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "common.hpp"

namespace dblock::cli {

// migrate.cpp: dblock migrate [--dry-run | --print-sql [--all]] [--json]
// [--lease-durability durable|fast]
struct migrate_options {
  bool dry_run = false;
  bool print_sql = false;
  bool all = false;
  bool json = false;
  std::string lease_durability;  // empty: leave as it is
};
CLI::App* add_migrate(CLI::App& app, common_options& common, migrate_options& m);
int run_migrate(const common_options& c, const migrate_options& m);

// reap.cpp: dblock reap [--retention D] [--batch N] [--grace D] [--json]
struct reap_options {
  bool json = false;
  std::string retention = "1h";
  std::string grace = "1s";
  std::size_t batch = 1000;
};
CLI::App* add_reap(CLI::App& app, common_options& common, reap_options& r);
int run_reap(const common_options& c, const reap_options& r);

// status.cpp: dblock status [--json] [--all] [pattern]
struct status_options {
  bool json = false;
  bool all = false;
  std::string pattern;
};
CLI::App* add_status(CLI::App& app, common_options& common, status_options& s);
int run_status(const common_options& c, const status_options& s);

// status.cpp: dblock release --force [--reason TEXT] name
struct release_options {
  bool force = false;
  std::string name;
  int permit = -1;      // >= 0: NAME is a semaphore, release this permit
  bool leader = false;  // NAME is an election: release its leadership
  int reader = -1;      // >= 0: NAME is a read-write lock, release this reader slot
  std::string reason;
};
CLI::App* add_release(CLI::App& app, common_options& common, release_options& r);
int run_release(const common_options& c, const release_options& r);

// status.cpp: dblock row-mode [--wait D] name
struct row_mode_options {
  std::string name;
  std::string wait = "10s";
};
CLI::App* add_row_mode(CLI::App& app, common_options& common, row_mode_options& r);
int run_row_mode(const common_options& c, const row_mode_options& r);

// exec.cpp: dblock exec --lock NAME [--lock NAME]... [--ttl D] [--wait D] [--kill-after D]
// -- command...
struct exec_options {
  std::vector<std::string> locks;  // one: the writer of a read-write lock; more: a lock set
  std::string shared;              // instead of --lock: a reader of this read-write lock
  bool use_shared = false;         // --shared was given
  std::string semaphore;           // instead of --lock: a permit of this semaphore
  bool use_semaphore = false;      // --semaphore was given (its value may be empty: refused later)
  int permits = 0;                 // its declared permits (required with --semaphore)
  std::string ttl = "30s";
  std::string wait = "0s";
  std::string kill_after;  // empty: a sixth of ttl
  bool fair = false;
  int conflict_exit_code = 75;  // -E: the status when the lock stays busy (flock's -E)
  std::string once;             // --once KEY: at most one success ever (runs.hpp)
  std::string every;            // --every PERIOD (with one --lock): at most one success per slot
  std::string shell;            // -c: run `sh -c SHELL` instead of a command
  std::vector<std::string> command;
};
CLI::App* add_exec(CLI::App& app, common_options& common, exec_options& x);
int run_exec(const common_options& c, const exec_options& x);

// runs.cpp: dblock runs [--json] [--limit N] [KEY] | dblock runs --forget --reason TEXT KEY
struct runs_options {
  bool json = false;
  bool forget = false;
  std::size_t limit = 50;
  std::string reason;
  std::string key;
};
CLI::App* add_runs(CLI::App& app, common_options& common, runs_options& r);
int run_runs(const common_options& c, const runs_options& r);

// leader.cpp: dblock leader [--json] NAME
struct leader_options {
  std::string name;
  bool json = false;
};
CLI::App* add_leader(CLI::App& app, common_options& common, leader_options& l);
int run_leader(const common_options& c, const leader_options& l);

// id.cpp: dblock id [--name NAME] [--count N] [--block-size B]
struct id_options {
  std::string name = "default";
  long long count = 1;
  long long block_size = 0;  // 0: min(count, 1000)
};
CLI::App* add_id(CLI::App& app, common_options& common, id_options& i);
int run_id(const common_options& c, const id_options& i);

}  // namespace dblock::cli
