// The dblock command-line tool: migrate the schema, and guard commands with a lease lock.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "dblock/dblock.hpp"
#include "dialect/dialect.hpp"
#include "suite.hpp"

namespace {

using namespace dblock::cli;
using std::chrono::milliseconds;

std::atomic<pid_t> child_pid{0};

void forward_signal(int sig) {
  pid_t p = child_pid.load();
  if (p > 0) ::kill(p, sig);
}

int run_status(const common_options& c, bool json, bool all, const std::string& pattern) {
  auto db = open_db(c);
  dblock::list_options lo;
  lo.pattern = pattern;
  lo.include_free = all;
  auto locks = dblock::list_locks(db, lo);
  auto forced = dblock::recent_forced_releases(db, 5);
  const auto now = std::chrono::system_clock::now();
  if (json) {
    nlohmann::json j;
    j["database"] = db.redacted_url();
    j["locks"] = nlohmann::json::array();
    for (const auto& l : locks)
      j["locks"].push_back({{"name", l.name},
                            {"held", l.held},
                            {"holder", l.holder_host + ":" + std::to_string(l.holder_pid)},
                            {"holder_thread", l.holder_thread},
                            {"owner_token", l.owner_token},
                            {"fence", l.fence},
                            {"hold_count", l.hold_count},
                            {"acquired_at", iso_time(l.acquired_at)},
                            {"expires_at", iso_time(l.expires_at)},
                            {"expires_in_ms", l.expires_in.count() / 1000}});
    j["forced_releases"] = nlohmann::json::array();
    for (const auto& f : forced)
      j["forced_releases"].push_back({{"name", f.name},
                                      {"previous_fence", f.previous_fence},
                                      {"new_fence", f.new_fence},
                                      {"previous_holder", f.previous_holder},
                                      {"was_held", f.was_held},
                                      {"forced_by", f.forced_by},
                                      {"reason", f.reason},
                                      {"at", iso_time(f.at)}});
    std::cout << j.dump(2) << "\n";
    return exit_ok;
  }
  std::size_t w = 4;
  for (const auto& l : locks)
    w = std::max(w, std::min<std::size_t>(shown(l.name).size(), 60));
  std::cout << std::left << std::setw(static_cast<int>(w)) << "NAME"
            << "  " << std::setw(28) << "HOLDER" << std::right << std::setw(10) << "FENCE"
            << std::setw(12) << "ACQUIRED" << std::setw(12) << "EXPIRES IN" << std::setw(6)
            << "HOLDS"
            << "\n";
  for (const auto& l : locks) {
    auto ago = std::chrono::duration_cast<std::chrono::microseconds>(now - l.acquired_at);
    std::cout << std::left << std::setw(static_cast<int>(w)) << shown(l.name).substr(0, 60) << "  "
              << std::setw(28) << (l.holder_host + ":" + std::to_string(l.holder_pid)).substr(0, 28)
              << std::right << std::setw(10) << l.fence << std::setw(12) << (human(ago) + " ago")
              << std::setw(12) << (l.held ? human(l.expires_in) : std::string("free"))
              << std::setw(6) << l.hold_count << "\n";
  }
  std::cout << locks.size() << (all ? " lock row(s)" : " held lock(s)")
            << (pattern.empty() ? "" : " matching '" + shown(pattern) + "'") << " in "
            << db.redacted_url() << "\n";
  if (!forced.empty()) {
    std::cout << "\nlast forced releases:\n";
    for (const auto& f : forced)
      std::cout << "  " << iso_time(f.at) << "  " << shown(f.name) << "  fence " << f.previous_fence
                << " -> " << f.new_fence << "  was " << (f.was_held ? "held" : "free") << " by "
                << f.previous_holder << "  forced by " << shown(f.forced_by) << ": "
                << shown(f.reason) << "\n";
  }
  return exit_ok;
}

std::string who_am_i() {
  const char* user = std::getenv("SUDO_USER");
  if (!user || !*user) user = std::getenv("USER");
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(user && *user ? user : "unknown") + "@" + host;
}

int run_release(const common_options& c, bool force, const std::string& name,
                const std::string& reason) {
  if (!force) {
    std::cerr << "dblock release: releasing someone else's lease is dangerous; pass --force "
                 "(and --reason) to do it\n";
    return exit_usage;
  }
  auto db = open_db(c);
  try {
    auto f = dblock::force_release(db, name, reason, who_am_i());
    std::cout << "released '" << shown(f.name) << "' (it was " << (f.was_held ? "held" : "free")
              << ", last holder " << f.previous_holder << "); fence " << f.previous_fence << " -> "
              << f.new_fence << ", recorded in the audit table\n";
    return exit_ok;
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::not_found) throw;
    std::cerr << "dblock release: " << shown(e.what()) << "\n";
    return exit_not_found;
  }
}

// The benchmark suite (bench/suite/): its own tables (prefix dblock_bench_ unless given), never
// the production lock table.
int run_bench(const common_options& c, const std::vector<std::string>& urls,
              dblock::bench::options o) {
  o.urls = urls;
  if (o.urls.empty()) o.urls.push_back(url_or_env(""));
  if (!c.prefix.empty()) o.prefix = c.prefix;
  dblock::detail::make_table_names(o.prefix);  // validates the prefix
  return dblock::bench::run(o, std::cout, std::cerr);
}

int run_migrate(const common_options& c, bool dry_run) {
  auto db = open_db(c);
  auto r = dblock::migrate(db, dblock::migrate_options{dry_run});
  std::size_t pending = 0;
  for (const auto& f : r.files) {
    bool now =
        std::find(r.applied_now.begin(), r.applied_now.end(), f.version) != r.applied_now.end();
    const char* state = now ? "applied now" : f.applied ? "applied" : "pending";
    if (!f.applied) ++pending;
    std::cout << "  " << f.name << "  " << f.checksum << "  " << state << "\n";
  }
  for (int v : r.unknown_applied)
    std::cout << "  version " << v << " is applied in the database but unknown to this dblock\n";
  if (dry_run)
    std::cout << pending << " pending migration(s) in " << db.redacted_url() << " (dry run)\n";
  else
    std::cout << r.applied_now.size() << " migration(s) applied, schema up to date in "
              << db.redacted_url() << "\n";
  return exit_ok;
}

int run_reap(const common_options& c, const std::string& retention, std::size_t batch,
             const std::string& grace) {
  auto db = open_db(c);
  dblock::reaper_options o;
  o.retention = parse_duration(retention, "--retention");
  o.floor_grace = parse_duration(grace, "--grace");
  o.batch_size = batch;
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
  std::cout << "reaped " << r.rows_reaped << " rows expired more than " << retention << " ago in "
            << r.batches << " batches, " << static_cast<long long>(secs * 1000) << " ms ("
            << (secs > 0 ? static_cast<long long>(r.rows_reaped / secs) : 0) << " rows/s)"
            << (r.complete ? "" : "; stopped early, rows remain") << "\n";
  return exit_ok;
}

struct exec_options {
  std::string lock;
  std::string ttl = "30s";
  std::string wait = "0s";
  std::string kill_after = "10s";
  std::vector<std::string> command;
};

int run_exec(const common_options& c, const exec_options& x) {
  auto db = open_db(c);
  std::atomic<bool> lost{false};
  dblock::lease_options lo;
  lo.ttl = parse_duration(x.ttl, "--ttl");
  lo.watchdog = true;
  lo.on_lost = [&lost](const dblock::error& e) {
    lost = true;
    std::cerr << "dblock exec: " << shown(e.what()) << "; sending SIGTERM to the command\n";
    pid_t p = child_pid.load();
    if (p > 0) ::kill(p, SIGTERM);
  };
  milliseconds wait = parse_duration(x.wait, "--wait");
  milliseconds kill_after = parse_duration(x.kill_after, "--kill-after");
  dblock::lease_lock lock(db, x.lock, lo);

  std::optional<dblock::lease_guard> guard;
  try {
    if (wait.count() > 0)
      guard.emplace(lock.acquire(wait));
    else
      guard = lock.try_acquire();
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::timeout) throw;
  }
  if (!guard) {
    std::cerr << "dblock exec: lock '" << shown(x.lock) << "' is held by another owner";
    if (wait.count() > 0) std::cerr << " and was not freed within " << x.wait;
    std::cerr << "; not running the command\n";
    return exit_not_acquired;
  }
  if (c.verbose)
    std::cerr << "dblock exec: acquired '" << shown(x.lock) << "' fence " << guard->fence() << "\n";

  struct sigaction sa {};
  sa.sa_handler = forward_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
    sigaction(sig, &sa, nullptr);

  std::string fence = std::to_string(guard->fence());
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
      signal(sig, SIG_DFL);
    setenv("DBLOCK_FENCE", fence.c_str(), 1);
    setenv("DBLOCK_OWNER", guard->owner_token().c_str(), 1);
    setenv("DBLOCK_LOCK", x.lock.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : x.command)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    int err = errno;
    std::fprintf(stderr, "dblock exec: cannot run '%s': %s\n", argv[0], std::strerror(err));
    _exit(err == ENOENT ? 127 : 126);
  }
  child_pid = pid;
  if (lost) ::kill(pid, SIGTERM);

  int status = 0;
  bool killed = false;
  auto term_sent = std::chrono::steady_clock::time_point::max();
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (lost && term_sent == std::chrono::steady_clock::time_point::max())
      term_sent = std::chrono::steady_clock::now();
    if (lost && !killed && std::chrono::steady_clock::now() - term_sent > kill_after) {
      ::kill(pid, SIGKILL);
      killed = true;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  child_pid = 0;
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);

  if (lost) {
    std::cerr << "dblock exec: the lease on '" << shown(x.lock)
              << "' was lost while the command ran (it was sent SIGTERM); exit " << exit_lease_lost
              << "\n";
    guard.reset();
    return exit_lease_lost;
  }
  try {
    guard->release();
  } catch (const dblock::error& e) {
    if (e.code() == dblock::errc::lease_lost) {
      std::cerr << "dblock exec: " << shown(e.what()) << "\n";
      return exit_lease_lost;
    }
    // The command ran to its end under the lease; only the release failed (for example the
    // connection broke). The lease expires by itself within --ttl, nobody renews it. Report
    // and keep the command's status, which is what the caller scripts on.
    std::cerr << "dblock exec: warning: could not release '" << shown(x.lock) << "' ("
              << shown(e.what()) << "); it expires within " << x.ttl << "\n";
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  common_options common;
  CLI::App app{"dblock: distributed locks on PostgreSQL, MySQL/MariaDB and SQLite"};
  app.require_subcommand(1);
  app.add_flag("-v,--verbose", common.verbose, "say more on stderr (also after the subcommand)");
  app.footer(
      "Exit statuses: 0 ok; 1 release: no such lock; 2 usage or invalid argument; 69 cannot "
      "connect; 70 internal error;\n"
      "75 lock not acquired; 76 lease lost while the command ran; 78 schema missing or\n"
      "mismatched. `exec` otherwise exits with the command's status (128+N if killed by N).");

  bool dry_run = false;
  auto* migrate = app.add_subcommand("migrate", "create or upgrade dblock's tables");
  add_common(migrate, common);
  migrate->add_flag("--dry-run", dry_run, "list applied and pending migrations, change nothing");

  std::string retention = "1h", grace = "1s";
  std::size_t batch = 1000;
  auto* reap = app.add_subcommand("reap", "delete lease rows that expired long ago, in batches");
  add_common(reap, common);
  reap->add_option("--retention", retention, "delete rows expired more than this long ago")
      ->capture_default_str();
  reap->add_option("--batch", batch, "rows per delete transaction (1..10000)")
      ->capture_default_str();
  reap->add_option("--grace", grace,
                   "pause between raising the fence floor and deleting (keeps fences monotonic)")
      ->capture_default_str();

  bool json = false, all = false;
  std::string pattern;
  auto* status = app.add_subcommand("status", "list held locks (and recent forced releases)");
  add_common(status, common);
  status->add_flag("--json", json, "machine-readable output (see README for the shape)");
  status->add_flag("--all", all, "include released and expired rows");
  status->add_option("pattern", pattern, "name pattern, shell style: 'jobs/*'");

  bool force = false;
  std::string release_name, reason;
  auto* release = app.add_subcommand("release", "force a stuck lease free (audited)");
  add_common(release, common);
  release->add_flag("--force", force, "required: take the lease from its holder");
  release->add_option("--reason", reason, "why (recorded in the audit table)");
  release->add_option("name", release_name, "lock name")->required();

  dblock::bench::options bench_opts;
  std::vector<std::string> bench_urls;
  auto* bench = app.add_subcommand(
      "bench", "benchmark suite: dblock against the raw-SQL floor and the alternatives");
  bench->add_option("--url", bench_urls,
                    "database URL, repeatable: one per backend to measure (default $DBLOCK_URL)");
  bench->add_option("--table-prefix", common.prefix,
                    "prefix of the benchmark's tables (default dblock_bench_)");
  bench->add_flag("-v,--verbose", common.verbose, "say more on stderr");
  bench->add_option("--seconds", bench_opts.seconds, "seconds per measurement")
      ->check(CLI::Range(0.01, 600.0))
      ->capture_default_str();
  bench->add_option("--clients", bench_opts.clients, "client counts (threads, own connections)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',');
  bench
      ->add_option("--rounds", bench_opts.repeat,
                   "rounds of every measurement; each figure is the median over them")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  bench->add_option("--only", bench_opts.only,
                    "run only the operations whose name contains this (e.g. lease, handoff)");
  bench->add_option("--redis", bench_opts.redis,
                    "HOST:PORT of a throwaway redis-server for the Redis comparison");
  bench->add_option("--json", bench_opts.json_path, "write the results as JSON (bench/README.md)");
  bench->add_option("--plot", bench_opts.plot_path,
                    "draw throughput against clients into this SVG file (needs gnuplot)");
  bench->add_option("--keys", bench_opts.keys, "distinct keys per client for spread operations")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  bench
      ->add_option("--poll-max-ms", bench_opts.poll_max_ms,
                   "lease_options::poll_max of the waiting acquires (0: the library default)")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  bench
      ->add_option("--hold-us", bench_opts.hold_us,
                   "how long a holder keeps the lock in the handoff measurement (µs)")
      ->check(CLI::Range(0, 10000000))
      ->capture_default_str();

  exec_options x;
  auto* exec = app.add_subcommand("exec", "run a command while holding a lease lock");
  add_common(exec, common);
  exec->add_option("--lock", x.lock, "lock (resource) name")->required();
  exec->add_option("--ttl", x.ttl, "lease length, renewed at ttl/3 while the command runs")
      ->capture_default_str();
  exec->add_option("--wait", x.wait, "how long to wait for the lock (0s: try once)")
      ->capture_default_str();
  exec->add_option("--kill-after", x.kill_after,
                   "after the lease is lost and SIGTERM sent, SIGKILL after this long")
      ->capture_default_str();
  exec->add_option("command", x.command, "command and arguments (after --)")->required();
  exec->positionals_at_end();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? exit_ok : exit_usage;
  }

  try {
    if (migrate->parsed()) return run_migrate(common, dry_run);
    if (exec->parsed()) return run_exec(common, x);
    if (reap->parsed()) return run_reap(common, retention, batch, grace);
    if (status->parsed()) return run_status(common, json, all, pattern);
    if (release->parsed()) return run_release(common, force, release_name, reason);
    if (bench->parsed()) return run_bench(common, bench_urls, bench_opts);
  } catch (const dblock::error& e) {
    std::cerr << "dblock: " << shown(e.what()) << "\n";
    return exit_status_for(e);
  } catch (const std::exception& e) {
    std::cerr << "dblock: " << shown(e.what()) << "\n";
    return exit_software;
  }
  return exit_usage;
}
