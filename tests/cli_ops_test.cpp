// The operations subcommands of the `dblock` CLI (DBLOCK_CLI_PATH), run as a separate process on
// each backend: status (table, --json, --all, pattern), release --force (exit statuses, audit,
// the holder's lease_lost), bench, reap, migrate --dry-run, -v/--verbose and the URL fallback.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/url.hpp"
#include "dblock/version.hpp"
#include "harness.hpp"
#include "test_paths.hpp"

extern char** environ;

using dblock::lease_lock;
using namespace dblock::test;

namespace {

using steady = std::chrono::steady_clock;

constexpr int exit_not_found = 1;
constexpr int exit_pending = 1;  // migrate --dry-run with migrations pending
constexpr int exit_usage = 64;   // EX_USAGE
constexpr int exit_schema = 78;

struct cli_result {
  int status = -1;  // exit status, 128+signal when killed, -1 when it had to be killed
  std::string out;  // stdout
  std::string err;  // stderr
  double seconds = 0;
};

std::ostream& operator<<(std::ostream& os, const cli_result& r) {
  return os << "exit " << r.status << " after " << r.seconds << " s\n--- stdout ---\n"
            << r.out << "--- stderr ---\n"
            << r.err;
}

// Runs the CLI (or `program`) with stdout and stderr captured separately, stdin on /dev/null.
// `env` changes the child's environment: "NAME=VALUE" sets a variable, a bare "NAME" removes it.
cli_result run_cli(const std::vector<std::string>& args, const std::vector<std::string>& env = {},
                   milliseconds timeout = std::chrono::seconds(60),
                   const std::string& program = DBLOCK_CLI_PATH) {
  exec_argv argv({program}, args);
  // The environment is built before fork(): the child only calls async-signal-safe functions.
  std::vector<std::string> env_s = env;
  std::vector<char*> envp;
  for (char** e = environ; *e; ++e) {
    bool drop = false;
    for (const auto& c : env_s) {
      const std::string key = c.substr(0, c.find('='));
      drop = drop || (std::strncmp(*e, key.c_str(), key.size()) == 0 && (*e)[key.size()] == '=');
    }
    if (!drop) envp.push_back(*e);
  }
  for (auto& c : env_s)
    if (c.find('=') != std::string::npos) envp.push_back(c.data());
  envp.push_back(nullptr);

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
    throw std::runtime_error("pipe failed");
  const auto start = steady::now();
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    redirect_child_stdio(out[1], err[1]);
    ::execve(argv[0], argv.data(), envp.data());
    const char msg[] = "cli_ops_test: execve of the dblock CLI failed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  cli_result r;
  int fds[2] = {out[0], err[0]};
  std::string* sinks[2] = {&r.out, &r.err};
  const auto deadline = start + timeout;
  bool killed = false;
  while (fds[0] >= 0 || fds[1] >= 0) {
    if (!killed && steady::now() >= deadline) {
      dblock::test::describe_hung_process(pid);
      ::kill(pid, SIGKILL);
      killed = true;
    }
    pollfd p[2];
    for (int i = 0; i < 2; ++i)
      p[i] = pollfd{fds[i], POLLIN, 0};  // a negative fd is ignored by poll
    int n = ::poll(p, 2, 200);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t got = ::read(fds[i], buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(fds[i]);
        fds[i] = -1;
      } else {
        sinks[i]->append(buf, static_cast<std::size_t>(got));
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = killed ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(steady::now() - start).count();
  return r;
}

// `dblock SUB --url URL --table-prefix PREFIX REST...`
cli_result cli(const dblock::test::context& ctx, const std::string& sub,
               const std::vector<std::string>& rest = {}) {
  std::vector<std::string> a = {sub, "--url", ctx.url, "--table-prefix", ctx.prefix};
  a.insert(a.end(), rest.begin(), rest.end());
  return run_cli(a);
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string line;
  while (std::getline(in, line))
    out.push_back(line);
  return out;
}

// The table line of `name` in `dblock status` output ("" when absent).
std::string status_line(const std::string& out, const std::string& name) {
  for (const auto& l : lines_of(out))
    if (l.compare(0, name.size() + 1, name + " ") == 0) return l;
  return "";
}

std::string this_holder() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown:" + std::to_string(::getpid());
  return std::string(buf) + ":" + std::to_string(::getpid());
}

std::string escape_regex(const std::string& s) {
  static const std::regex special(R"([.^$|()\[\]{}*+?\\])");
  return std::regex_replace(s, special, R"(\$&)");
}

const std::string iso8601_re = R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)";
const std::regex iso8601(iso8601_re);

void release_some(const dblock::test::context& ctx, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    lease_lock l(ctx.db, n);
    auto g = l.try_acquire();
    REQUIRE(g);
    g->release();
  }
}

// Runs `dblock status rest...` and checks that it exits 0, says `summary`, has a table line for
// every name of `listed` and none for the names of `unlisted`; returns what it printed.
cli_result check_status(const dblock::test::context& ctx, const std::vector<std::string>& rest,
                        const std::string& summary, const std::vector<std::string>& listed,
                        const std::vector<std::string>& unlisted = {}) {
  auto r = cli(ctx, "status", rest);
  INFO(r);
  CHECK(r.status == 0);
  CHECK(contains(r.out, summary));
  for (const auto& name : listed)
    CHECK_FALSE(status_line(r.out, name).empty());
  for (const auto& name : unlisted)
    CHECK(status_line(r.out, name).empty());
  return r;
}

// Checks that `r` exited with `status` and printed a JSON object that names DBLOCK_VERSION_STRING
// as its "version"; returns the object.
nlohmann::json versioned_json(const cli_result& r, int status) {
  INFO(r);
  CHECK(r.status == status);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(r.out));
  CHECK(j.value("version", "") == DBLOCK_VERSION_STRING);
  return j;
}

}  // namespace

// ---- status -----------------------------------------------------------------------------------

DBLOCK_TEST("cli status: a table of held locks with fence and holder", "[cli]") {
  release_some(ctx, {"status/free"});
  lease_lock lock(ctx.db, "status/held");
  auto g = lock.try_acquire();
  REQUIRE(g);
  auto g2 = lock.try_acquire();  // two holds
  REQUIRE(g2);

  auto r = cli(ctx, "status");
  INFO(r);
  CHECK(r.status == 0);
  auto lines = lines_of(r.out);
  REQUIRE(lines.size() >= 3);
  CHECK(std::regex_search(
      lines[0], std::regex(R"(^NAME\s+HOLDER\s+FENCE\s+ACQUIRED\s+EXPIRES IN\s+HOLDS\s+WAITERS\s+)"
                           R"(OLDEST WAIT\s+HEAD WAITER$)")));
  const std::string row = status_line(r.out, "status/held");
  CHECK(std::regex_search(
      row, std::regex("^status/held +" + escape_regex(this_holder()) + " +" +
                      std::to_string(g->fence()) + R"( +-?[0-9.]+s ago +[0-9.]+s +2 +0 +- +-$)")));
  CHECK(status_line(r.out, "status/free").empty());
  CHECK(contains(r.out, "1 held lock(s) in "));
  {
    const dblock::server_info server = ctx.db.server();
    CHECK(contains(r.out, " (" + server.product + " " + server.version + ")\n"));
  }
  CHECK_FALSE(contains(r.out, "last forced releases"));
  CHECK_FALSE(contains(r.out + r.err, "dblock-secret"));  // the password is never printed
  CHECK(r.err.empty());
}

DBLOCK_TEST("cli status --all lists released rows; a pattern filters names", "[cli]") {
  release_some(ctx, {"jobs/done"});
  std::vector<std::unique_ptr<lease_lock>> locks;
  std::vector<dblock::lease_guard> guards;
  for (const char* n : {"jobs/a", "jobs/b", "other/c", "Jobs/d"}) {
    locks.push_back(std::make_unique<lease_lock>(ctx.db, n));
    auto g = locks.back()->try_acquire();
    REQUIRE(g);
    guards.push_back(std::move(*g));
  }
  check_status(ctx, {}, "4 held lock(s) in ", {}, {"jobs/done"});
  auto all = check_status(ctx, {"--all"}, "5 lock row(s) in ", {"jobs/a"});
  {
    INFO(all);
    CHECK(
        std::regex_search(status_line(all.out, "jobs/done"), std::regex(R"( free +0 +0 +- +-$)")));
  }
  check_status(ctx, {"jobs/*"}, "2 held lock(s) matching 'jobs/*' in ", {"jobs/a", "jobs/b"},
               {"Jobs/d", "other/c"});
  check_status(ctx, {"--all", "jobs/?one"}, "1 lock row(s) matching 'jobs/?one'", {"jobs/done"});
  check_status(ctx, {"JOBS/*"}, "0 held lock(s) matching 'JOBS/*'", {});
}

DBLOCK_TEST("cli status --json: the documented shape", "[cli]") {
  release_some(ctx, {"json/free"});
  lease_lock lock(ctx.db, "json/held", [] {
    dblock::lease_options o;
    o.ttl = std::chrono::seconds(20);
    return o;
  }());
  auto g = lock.try_acquire();
  REQUIRE(g);
  const std::string tid = std::to_string(static_cast<long long>(::syscall(SYS_gettid)));

  auto r = cli(ctx, "status", {"--json"});
  INFO(r);
  REQUIRE(r.status == 0);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(r.out));
  REQUIRE(j.is_object());
  CHECK(j.size() == 6);
  CHECK(j.value("version", "") == DBLOCK_VERSION_STRING);
  // The server as database::server() names it.
  REQUIRE(j.contains("server"));
  const dblock::server_info server = ctx.db.server();
  CHECK(j["server"].value("product", "?") == server.product);
  CHECK(j["server"].value("version", "?") == server.version);
  CHECK_FALSE(server.version.empty());
  REQUIRE(j.contains("failover"));
  CHECK(j["failover"].value("window_ms", -1) == 0);  // a single server: unknown
  CHECK(j["failover"].value("min_ttl_ms", -1) == 0);
  CHECK(j["failover"].value("source", "?").empty());
  REQUIRE(j.contains("database"));
  CHECK(j["database"].is_string());
  CHECK_FALSE(contains(j["database"].get<std::string>(), "dblock-secret"));
  REQUIRE(j.contains("forced_releases"));
  CHECK(j["forced_releases"].is_array());
  CHECK(j["forced_releases"].empty());
  REQUIRE(j.contains("locks"));
  REQUIRE(j["locks"].is_array());
  REQUIRE(j["locks"].size() == 1);
  const auto& l = j["locks"][0];
  REQUIRE(l.is_object());
  for (const char* key : {"name", "mode", "held", "holder", "fence", "hold_count", "acquired_at",
                          "expires_at", "expires_in_ms", "owner_token", "holder_thread", "waiters",
                          "head_waiter", "oldest_wait_ms"})
    CHECK(l.contains(key));
  CHECK(l.size() == 14);
  CHECK(l.value("mode", "") == "row");
  CHECK(l.value("waiters", -1) == 0);
  CHECK(l.value("name", "") == "json/held");
  CHECK(l.value("held", false));
  CHECK(l.value("holder", "") == this_holder());
  CHECK(l["fence"].is_number_integer());
  CHECK(l.value("fence", 0LL) == g->fence());
  CHECK(l.value("hold_count", 0) == 1);
  CHECK(std::regex_match(l.value("acquired_at", ""), iso8601));
  CHECK(std::regex_match(l.value("expires_at", ""), iso8601));
  CHECK(l["expires_in_ms"].is_number_integer());
  CHECK(l.value("expires_in_ms", 0LL) > 15000);
  CHECK(l.value("expires_in_ms", 0LL) <= 20000);
  CHECK(l.value("owner_token", "") == g->owner_token());
  CHECK(l.value("holder_thread", "") == tid);

  auto all = cli(ctx, "status", {"--json", "--all"});
  INFO(all);
  REQUIRE(all.status == 0);
  auto ja = nlohmann::json::parse(all.out, nullptr, false);
  REQUIRE_FALSE(ja.is_discarded());
  REQUIRE(ja["locks"].size() == 2);
  CHECK(ja["locks"][0].value("name", "") == "json/free");
  CHECK(ja["locks"][0].value("held", true) == false);
  CHECK(ja["locks"][0].value("hold_count", -1) == 0);
  CHECK(ja["locks"][0].value("expires_in_ms", 1LL) <= 0);
}

// ---- release ----------------------------------------------------------------------------------

DBLOCK_TEST("cli release: refuses without --force (exit 64) and leaves the lease alone", "[cli]") {
  held_lease hold(ctx.db, "rel/held");
  auto r = cli(ctx, "release", {"rel/held"});
  INFO(r);
  CHECK(r.status == exit_usage);
  CHECK(contains(r.err, "--force"));
  CHECK_NOTHROW(hold.guard->renew());
  CHECK(dblock::recent_forced_releases(ctx.db).empty());
  // Without a name it is a usage error too.
  auto no_name = cli(ctx, "release", {"--force"});
  INFO(no_name);
  CHECK(no_name.status == exit_usage);
}

DBLOCK_TEST_SERVERS("cli row-mode: gives a session-mode name back to row mode",
                    "[cli][session_lease][direct]") {
  const std::string name = "rowmode/" + random_suffix();
  auto none = cli(ctx, "row-mode", {name});
  {
    INFO(none);
    CHECK(none.status == exit_not_found);
    CHECK(contains(none.err, "is not in session mode"));
  }
  lease_lock s(ctx.db, name, {}, dblock::lease_mode::session);
  auto g = s.try_acquire();
  REQUIRE(g);
  const auto fence = g->fence();
  auto busy = cli(ctx, "row-mode", {"--wait", "200ms", name});
  {
    INFO(busy);
    CHECK(busy.status == 75);  // not acquired: the holder keeps it
  }
  g.reset();
  auto r = cli(ctx, "row-mode", {name});
  {
    INFO(r);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "is back in row mode"));
  }
  lease_lock row_mode(ctx.db, name);
  auto rg = row_mode.try_acquire();
  REQUIRE(rg);
  CHECK(rg->fence() > fence);
}

DBLOCK_TEST("cli release --force: the holder loses the lease, status shows the audit", "[cli]") {
  held_lease hold(ctx.db, "rel/stuck");
  const auto fence = hold.guard->fence();
  const std::string reason = "stuck since the deploy";

  auto r = cli(ctx, "release", {"--force", "--reason", reason, "rel/stuck"});
  {
    INFO(r);
    CHECK(r.status == 0);
    CHECK(contains(r.out, "released 'rel/stuck'"));
    CHECK(contains(r.out, "it was held"));
    CHECK(contains(r.out, "last holder " + this_holder()));
    CHECK(contains(r.out, "fence " + std::to_string(fence) + " -> " + std::to_string(fence + 1)));
  }
  CHECK(code_of([&] { hold.guard->renew(); }) == errc::lease_lost);

  auto s = cli(ctx, "status");
  {
    INFO(s);
    CHECK(s.status == 0);
    CHECK(contains(s.out, "0 held lock(s)"));
    CHECK(contains(s.out, "last forced releases:"));
    std::regex line("  " + iso8601_re + "  rel/stuck  fence " + std::to_string(fence) + " -> " +
                    std::to_string(fence + 1) + "  was held by " + escape_regex(this_holder()) +
                    "  forced by \\S+@\\S+: " + reason + "\n");
    CHECK(std::regex_search(s.out, line));
  }
  auto j = cli(ctx, "status", {"--json"});
  INFO(j);
  REQUIRE(j.status == 0);
  auto doc = nlohmann::json::parse(j.out, nullptr, false);
  REQUIRE_FALSE(doc.is_discarded());
  REQUIRE(doc["forced_releases"].size() == 1);
  const auto& f = doc["forced_releases"][0];
  CHECK(f.value("name", "") == "rel/stuck");
  CHECK(f.value("reason", "") == reason);
  CHECK(f.value("previous_fence", 0LL) == fence);
  CHECK(f.value("new_fence", 0LL) == fence + 1);
  CHECK(f.value("was_held", false));
  CHECK(f.value("previous_holder", "") == this_holder());
  CHECK(contains(f.value("forced_by", ""), "@"));
  CHECK(std::regex_match(f.value("at", ""), iso8601));
}

DBLOCK_TEST("cli release --force of a missing name exits 1", "[cli]") {
  auto r = cli(ctx, "release", {"--force", "--reason", "typo", "rel/no-such-lock"});
  INFO(r);
  CHECK(r.status == exit_not_found);
  CHECK(contains(r.err, "rel/no-such-lock"));
  CHECK(dblock::recent_forced_releases(ctx.db).empty());
}

// ---- bench, reap, migrate ---------------------------------------------------------------------

// The benchmark suite cannot rot: every operation runs briefly on every backend, without a single
// error, and the table and the JSON (bench/README.md) have every row. It is dblock-bench, a
// program of its own (DBLOCK_BENCH_PATH), built with -DDBLOCK_BENCH=ON.
#ifdef DBLOCK_BENCH_PATH
namespace {

// `dblock-bench --url URL --table-prefix PREFIX ARGS --output FILE`: the run and the file's
// results (null when there is none).
std::pair<cli_result, nlohmann::json> bench_json(const dblock::test::context& ctx,
                                                 const std::vector<std::string>& args) {
  const std::string json_path = "/tmp/dblock-bench-test-" + dblock::test::random_suffix() + ".json";
  std::vector<std::string> a = {"--url", ctx.url, "--table-prefix", ctx.prefix};
  a.insert(a.end(), args.begin(), args.end());
  a.insert(a.end(), {"--output", json_path});
  // A hang bound, not a speed bound: the whole bench of the test below takes 20-35 s on a quiet
  // 2-core machine and several times that on a busy one.
  auto r = run_cli(a, {}, std::chrono::seconds(300), DBLOCK_BENCH_PATH);
  std::ifstream in(json_path);
  nlohmann::json j;
  if (in) j = nlohmann::json::parse(in);
  std::remove(json_path.c_str());
  return {r, j};
}

}  // namespace

DBLOCK_TEST("cli bench: every operation runs, the table and JSON have every row", "[cli][bench]") {
  const auto [r, j] = bench_json(ctx, {"--seconds", "0.05", "--rounds", "2", "--clients", "1,2",
                                       "--keys", "20", "--hold-us", "100"});
  INFO(r);
  REQUIRE(r.status == 0);
  REQUIRE(!j.is_null());
  CHECK(j.at("format") == "dblock-bench/1");
  CHECK(j.at("rounds") == 2);
  REQUIRE(j.at("backends").size() == 1);
  CHECK(j.at("backends")[0].at("backend") == ctx.backend);

  std::set<std::string> expected = {"raw.select1",
                                    "dblock.ping",
                                    "raw.lease",
                                    "dblock.lease",
                                    "raw.lease_hot",
                                    "dblock.lease_hot",
                                    "raw.renew",
                                    "dblock.renew",
                                    "raw.for_update",
                                    "dblock.for_update",
                                    "raw.optimistic_hot",
                                    "dblock.optimistic_hot",
                                    "raw.optimistic_spread",
                                    "dblock.optimistic_spread",
                                    "raw.cas",
                                    "dblock.cas",
                                    "raw.stock_take",
                                    "dblock.stock_take",
                                    "dblock.id_next",
                                    "dblock.semaphore",
                                    "dblock.semaphore_held10",
                                    "dblock.semaphore_held100",
                                    "dblock.read_lock",
                                    "dblock.read_lock_held10",
                                    "dblock.read_lock_held100",
                                    "dblock.write_lock",
                                    "dblock.tablesize_10",
                                    "dblock.tablesize_10k",
                                    "dblock.cas_order",
                                    "dblock.stock_order",
                                    "dblock.handoff",
                                    "dblock.handoff_shared",
                                    "dblock.handoff_fair",
                                    "dblock.semaphore_handoff",
                                    "dblock.rwlock_handoff"};
  // Behind a transaction-mode pooler (the pgbouncer entry) session-level advisory locks and
  // LISTEN do not work: the bench leaves those two out.
  if (ctx.backend == "postgresql" && ctx.url.find("pooler=transaction") == std::string::npos)
    expected.insert({"pg.advisory", "pg.advisory_fenced", "pgbench.advisory",
                     "pgbench.advisory_fenced", "dblock.lease_session", "raw.lease_session",
                     "dblock.handoff_session", "pg.notify_handoff", "raw.lease_fast",
                     "dblock.lease_fast", "dblock.handoff_fast"});
  if (ctx.backend == "mysql")
    expected.insert({"mysql.get_lock", "mysql.get_lock_fenced", "mysql.get_lock_counter"});
  // Session leases are refused in the MySQL 8 flavor (docs/mysql.md): no rows of theirs.
  if (ctx.backend == "mysql" && !dblock::test::mysql8_flavor(ctx.db))
    expected.insert({"dblock.lease_session", "raw.lease_session", "dblock.handoff_session"});
  expected.insert("harness.noop");  // on no backend: the harness's own cost
  if (ctx.backend != "sqlite") expected.insert("sql.lease");  // the SQL API's routines
  std::map<std::string, std::set<int>> seen;
  std::set<std::string> idle_ops;  // rows that completed nothing in their window
  for (const auto& row : j.at("results")) {
    const std::string op = row.at("operation");
    INFO(row.dump());
    const std::string label = row.at("label");
    if (op == "harness.noop") {
      CHECK(row.at("backend") == "none");
    } else {
      CHECK(row.at("backend") == ctx.backend);
      CHECK(label.rfind(ctx.backend, 0) == 0);  // "/pooler" behind a transaction-mode pooler
    }
    CHECK(row.at("errors") == 0);
    // Only handoffs inside the window count, and these windows are shorter than a handoff cycle
    // can be: the handoff rows are checked on a run of their own below. Any other row must show
    // progress; one that completed nothing in 50 ms on a busy machine runs again below.
    if (row.at("kind") != "handoff" &&
        !(row.at("successes").get<long long>() > 0 && row.at("per_second").get<double>() > 0))
      idle_ops.insert(op);
    CHECK(row.at("p50_us").get<double>() <= row.at("p99_us").get<double>());
    if (op == "dblock.semaphore_handoff" || op == "dblock.rwlock_handoff") {
      CHECK(row.at("floor") == "dblock.handoff");  // handoffs against the lease's (no ratio
                                                   // when no handoff fit the short window)
    } else if (op.rfind("dblock.semaphore", 0) == 0 || op.rfind("dblock.read_lock", 0) == 0 ||
               op == "dblock.write_lock" || op == "sql.lease") {  // against the lease cycle
      CHECK(row.at("floor") == "dblock.lease");
      CHECK(row.at("ratio").get<double>() > 0);
    }
    if (op == "dblock.tablesize_10") CHECK(row.at("floor") == "dblock.lease");
    if (op == "dblock.tablesize_10k") {  // against the 10-row table: flat or not
      CHECK(row.at("floor") == "dblock.tablesize_10");
      CHECK(row.at("ratio").get<double>() > 0);
    }
    if (row.at("kind") == "dblock") {
      CHECK(row.at("floor").get<std::string>().rfind("raw.", 0) == 0);
      CHECK(row.at("ratio").get<double>() > 0);
    }
    if (op.rfind("pgbench.", 0) == 0 && row.at("successes").get<long long>() > 0)
      CHECK(row.at("latency_mean_us").get<double>() > 0);  // pgbench's own mean, no percentiles
    seen[op].insert(row.at("clients").get<int>());
    // Every row is in the printed table too.
    CHECK(std::regex_search(
        r.out, std::regex("\\n" + label + " +" + std::regex_replace(op, std::regex("\\."), "\\.") +
                          " +" + std::to_string(row.at("clients").get<int>()) + " ")));
  }
  for (const auto& op : expected) {
    INFO(op);
    const std::set<int> clients =
        op.find("handoff") != std::string::npos ? std::set<int>{2} : std::set<int>{1, 2};
    CHECK(seen[op] == clients);
  }
  CHECK(seen.size() == expected.size());  // dblock.tablesize_1m runs only when --only names it
  // A row that completed nothing runs again alone, in windows 4, 16 and 64 times as long: it must
  // make progress, at whatever speed the machine has now (the bench, not this test, measures it).
  for (double seconds = 0.2; !idle_ops.empty() && seconds < 4; seconds *= 4) {
    std::string only;
    for (const auto& op : idle_ops)
      only += (only.empty() ? "=" : ",=") + op;
    WARN("no operation completed in 50 ms, again in " << seconds << " s: " << only);
    const auto [again, aj] =
        bench_json(ctx, {"--only", only, "--seconds", std::to_string(seconds), "--rounds", "1",
                         "--clients", "1,2", "--keys", "20", "--hold-us", "100"});
    INFO(again);
    REQUIRE(again.status == 0);
    REQUIRE(!aj.is_null());
    std::set<std::string> still;
    for (const auto& row : aj.at("results"))
      if (!(row.at("successes").get<long long>() > 0 && row.at("per_second").get<double>() > 0))
        still.insert(row.at("operation").get<std::string>());
    idle_ops = still;
  }
  INFO("operations that completed nothing, even in a 3.2 s window");
  CHECK(idle_ops.empty());

  // The handoff rows with windows long enough for handoffs to happen inside them: latencies,
  // the measured hold (at least the --hold-us asked for) and, when a handoff completed within
  // the window, the rate against 1 / (hold + the one-client lease cycle) of the same run.
  // A window in which no handoff landed (a busy machine) is run again, 4 and 16 times as long.
  auto handoff_run = [&](double seconds) {
    return bench_json(ctx, {"--only", "handoff,dblock.lease", "--seconds", std::to_string(seconds),
                            "--rounds", "1", "--clients", "1,2", "--hold-us", "100"});
  };
  auto no_handoff_landed = [](const nlohmann::json& results) {
    if (results.is_null()) return false;
    for (const auto& row : results.at("results"))
      if (row.at("kind") == "handoff" && !(row.at("p50_us").get<double>() > 0)) return true;
    return false;
  };
  auto [h, hj] = handoff_run(0.3);
  for (double seconds = 1.2; h.status == 0 && no_handoff_landed(hj) && seconds < 5; seconds *= 4) {
    WARN("a handoff row had no handoff in its window; again in " << seconds << " s");
    std::tie(h, hj) = handoff_run(seconds);
  }
  {
    INFO(h);
    REQUIRE(h.status == 0);
    REQUIRE(!hj.is_null());
    int handoff_rows = 0;
    for (const auto& row : hj.at("results")) {
      if (row.at("kind") != "handoff") continue;
      ++handoff_rows;
      INFO(row.dump());
      CHECK(row.at("errors") == 0);
      CHECK(row.at("p50_us").get<double>() > 0);
      if (row.at("operation").get<std::string>().rfind("dblock.", 0) == 0 &&
          row.at("per_second").get<double>() > 0) {
        CHECK(row.value("hold_mean_us", 0.0) >= 100);
        CHECK(row.value("rate_over_hold_plus_lease_cycle", 0.0) > 0);
      }
      // Waits counted in turns too: with one waiter (2 clients) nobody else is granted the
      // lease during a wait.
      if (row.contains("wait_mean_us")) {
        CHECK(row.value("turns_mean", -1.0) == 0);
        CHECK(row.value("turns_max", -1.0) == 0);
      }
    }
    CHECK(handoff_rows >= 3);
  }
  const std::string label = j.at("backends").at(0).at("label");
  CHECK(j.at("contention_collapse").at(label).contains("dblock.lease_hot"));
  CHECK(contains(r.out, "handoffs (waiters woken per release"));
  CHECK(contains(r.err, "bench: ["));  // progress
  CHECK(contains(r.err, "redis.lock skipped"));
  CHECK(contains(r.out, "rt/op"));

  // Round trips per operation (#19): every dblock operation sends no more requests than the
  // raw SQL it is measured against (hot-key and handoff rows wait and retry by design, and are
  // left out); SQLite sends none.
  std::map<std::pair<std::string, int>, double> trips;
  for (const auto& row : j.at("results"))
    if (row.contains("round_trips_per_op"))
      trips[{row.at("operation").get<std::string>(), row.at("clients").get<int>()}] =
          row.at("round_trips_per_op").get<double>();
  CHECK(trips.count({"raw.select1", 1}) == 1);
  CHECK(trips[{"raw.select1", 1}] == (ctx.backend == "sqlite" ? 0.0 : 1.0));
  int compared = 0;
  for (const auto& row : j.at("results")) {
    const std::string op = row.at("operation");
    if (row.at("kind") != "dblock" || op.find("hot") != std::string::npos) continue;
    const int clients = row.at("clients");
    const std::string floor = row.at("floor");
    INFO(op << " at " << clients << " clients against " << floor);
    REQUIRE(trips.count({op, clients}) == 1);
    REQUIRE(trips.count({floor, clients}) == 1);
    CHECK(trips[{op, clients}] <= trips[{floor, clients}] + 0.1);
    ++compared;
  }
  CHECK(compared >= 12);  // 7 operations at 1 and 2 clients (PostgreSQL: 8)

  // --only =NAME selects that operation alone: "=dblock.handoff_fair" neither the other handoff
  // rows (which "handoff" would select) nor any other; a plain part still selects by substring.
  const auto [e, ej] = bench_json(ctx, {"--only", "=dblock.handoff_fair,ping", "--seconds", "0.2",
                                        "--rounds", "1", "--clients", "1,2"});
  INFO(e);
  REQUIRE(e.status == 0);
  REQUIRE(!ej.is_null());
  std::set<std::string> ran;
  for (const auto& row : ej.at("results"))
    ran.insert(row.at("operation").get<std::string>());
  CHECK(ran == std::set<std::string>{"dblock.handoff_fair", "dblock.ping"});
}

DBLOCK_TEST("cli bench: dblock.watchdog holds many watched leases on two threads, none lost",
            "[cli][bench]") {
  const auto [r, j] =
      bench_json(ctx, {"--only", "dblock.watchdog", "--leases", "300", "--leases-ttl-ms", "2000"});
  INFO(r);
  REQUIRE(r.status == 0);
  REQUIRE(!j.is_null());
  std::set<std::string> seen;
  for (const auto& row : j.at("results")) {
    INFO(row.dump());
    seen.insert(row.at("operation").get<std::string>());
    CHECK(row.at("errors") == 0);
    CHECK(row.at("successes") == 300);
    if (row.at("operation") != "dblock.watchdog") continue;
    CHECK(row.at("floor") == "raw.acquire_many");
    CHECK(row.at("ratio").get<double>() > 0);
    CHECK(row.at("lost") == 0);
    CHECK(row.at("still_valid") == 300);
    CHECK(row.at("threads_added").get<double>() <= 2);
    // Held for three TTLs, renewed every third of one: at least six rounds of 300.
    CHECK(row.at("renewals").get<double>() >= 6 * 300);
    CHECK(row.at("renewal_statements").get<double>() > 0);
  }
  CHECK(seen == std::set<std::string>{"raw.acquire_many", "dblock.watchdog"});
  CHECK(contains(r.out, "watchdog, " + j.at("backends").at(0).at("label").get<std::string>() +
                            ": 300 leases"));
}

#endif  // DBLOCK_BENCH_PATH

DBLOCK_TEST("cli reap: deletes released rows, keeps held ones, says how many", "[cli]") {
  release_some(ctx, {"reap/a", "reap/b", "reap/c"});
  held_lease hold(ctx.db, "reap/held");
  auto r = cli(ctx, "reap", {"--retention", "0s", "--grace", "0s", "-v"});
  {
    INFO(r);
    CHECK(r.status == 0);
    CHECK(std::regex_search(r.out,
                            std::regex(R"(^reaped 3 rows expired more than 0s ago in 1 batches)")));
    CHECK(contains(r.err, "dblock: reaped 3 rows"));  // the listener's line (verbose)
  }
  dblock::list_options all;
  all.include_free = true;
  auto rows = dblock::list_locks(ctx.db, all);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].name == "reap/held");
  auto again = cli(ctx, "reap", {"--retention", "0s", "--grace", "0s"});
  INFO(again);
  CHECK(again.status == 0);
  CHECK(contains(again.out, "reaped 0 rows"));
}

DBLOCK_TEST("cli migrate --dry-run: lists applied and pending files, changes nothing", "[cli]") {
  auto r = cli(ctx, "migrate", {"--dry-run"});
  {
    INFO(r);
    CHECK(r.status == 0);
    CHECK(std::regex_search(r.out,
                            std::regex(R"(  0001_resource_lock\.sql  [0-9a-f]{16}  applied\n)")));
    CHECK(std::regex_search(
        r.out, std::regex(R"(  0002_force_release_audit\.sql  [0-9a-f]{16}  applied\n)")));
    CHECK(contains(r.out, "0 pending migration(s)"));
    CHECK(contains(r.out, "(dry run)"));
    CHECK_FALSE(contains(r.out, "applied now"));
  }
  const std::string fresh = ctx.new_prefix();
  auto d = run_cli({"migrate", "--url", ctx.url, "--table-prefix", fresh, "--dry-run"});
  {
    INFO(d);
    CHECK(d.status == exit_pending);  // a deploy gate: not up to date
    CHECK(std::regex_search(d.out,
                            std::regex(R"(  0001_resource_lock\.sql  [0-9a-f]{16}  pending\n)")));
    CHECK(std::regex_search(
        d.out, std::regex(R"(  0002_force_release_audit\.sql  [0-9a-f]{16}  pending\n)")));
    // Every file this backend ships (PostgreSQL has one more than the others since 0010).
    dblock::migrate_options dry;
    dry.dry_run = true;
    const auto shipped =
        dblock::migrate(dblock::test::open_db(ctx.url, fresh, 1), dry).files.size();
    CHECK(shipped >= 9);
    CHECK(contains(d.out, std::to_string(shipped) + " pending migration(s)"));
  }
  // Nothing was created: the fresh prefix still has no schema.
  auto s = run_cli({"status", "--url", ctx.url, "--table-prefix", fresh});
  INFO(s);
  CHECK(s.status == exit_schema);
  CHECK(contains(s.err, "dblock migrate"));
}

namespace {

// The URL of `ctx` for the backend's own command-line client: a shell command that runs the SQL
// file `file` with it, stopping at the first error.
std::string client_command(const dblock::test::context& ctx, const std::string& file) {
  auto u = dblock::detail::parse_url(ctx.url);
  auto q = [](const std::string& v) { return "'" + v + "'"; };  // test values: no quotes
  if (ctx.backend == "sqlite") return "sqlite3 -bail " + q(u.path) + " < " + q(file);
  const std::string host = u.host.empty() ? "127.0.0.1" : u.host;
  const std::string port = u.port ? std::to_string(*u.port) : "";
  if (ctx.backend == "postgresql")
    return "PGPASSWORD=" + q(u.password.value_or("")) + " psql -X -q -v ON_ERROR_STOP=1 -h " +
           q(host) + (port.empty() ? "" : " -p " + port) + " -U " + q(u.user) + " -d " + q(u.path) +
           " -f " + q(file);
  return "MYSQL_PWD=" + q(u.password.value_or("")) + " mysql --protocol=TCP -h " + q(host) +
         (port.empty() ? "" : " -P " + port) + " -u " + q(u.user) + " " + q(u.path) + " < " +
         q(file);
}

}  // namespace

DBLOCK_TEST(
    "cli migrate --print-sql: the backend's own client runs it, then the schema is up "
    "to date and a lock works",
    "[cli]") {
  const std::string fresh = ctx.new_prefix();
  const std::vector<std::string> on_fresh = {"--url", ctx.url, "--table-prefix", fresh};
  auto with = [&on_fresh](std::vector<std::string> a) {
    a.insert(a.begin() + 1, on_fresh.begin(), on_fresh.end());
    return a;
  };
  auto sql = run_cli(with({"migrate", "--print-sql"}));
  INFO(sql);
  REQUIRE(sql.status == 0);
  CHECK(contains(sql.out, "-- dblock " DBLOCK_VERSION_STRING ": "));
  CHECK(contains(sql.out, "0001_resource_lock.sql"));
  CHECK(contains(sql.out, fresh + "resource_lock"));
  CHECK_FALSE(contains(sql.out, "{{prefix}}"));
  // Nothing was created by printing: still pending (the control of the check below).
  REQUIRE(run_cli(with({"migrate", "--dry-run"})).status == exit_pending);

  const std::string file = "/tmp/dblock-print-sql-" + dblock::test::random_suffix(8) + ".sql";
  {
    std::ofstream f(file);
    f << sql.out;
  }
  const std::string cmd = client_command(ctx, file) + " 2>&1";
  std::string client_out;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p))
    client_out += buf;
  const int rc = ::pclose(p);
  ::unlink(file.c_str());
  INFO("client: " << client_out);
  REQUIRE(rc == 0);

  auto dry = run_cli(with({"migrate", "--dry-run", "--json"}));
  INFO(dry);
  CHECK(dry.status == 0);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(dry.out));
  CHECK(j.value("version", "") == DBLOCK_VERSION_STRING);
  CHECK(j.value("pending", -1) == 0);
  CHECK(j.value("dry_run", false));
  REQUIRE(j["migrations"].is_array());
  CHECK(j["migrations"].size() >= 9);
  for (const auto& m : j["migrations"])
    CHECK(m.value("state", "") == "applied");
  auto run =
      run_cli(with({"exec", "--lock", "printsql/x", "--", "sh", "-c", "echo $DBLOCK_FENCE"}));
  INFO(run);
  CHECK(run.status == 0);
  CHECK(std::regex_match(run.out, std::regex(R"([1-9][0-9]*\n)")));
  // Now nothing is pending, and --all still prints every file (without reading the database).
  auto none = run_cli(with({"migrate", "--print-sql"}));
  CHECK(contains(none.out, ": 0 pending migration(s)"));
  CHECK_FALSE(contains(none.out, "0001_resource_lock.sql"));
  auto all = run_cli({"migrate", "--url",
                      ctx.backend == "sqlite" ? ctx.url : ctx.backend + "://u@127.0.0.1:1/x",
                      "--table-prefix", fresh, "--print-sql", "--all"});
  INFO(all);
  CHECK(all.status == 0);
  CHECK(contains(all.out, "0001_resource_lock.sql"));
  CHECK(contains(all.out, "migration(s), all"));
  // --all without --print-sql, and --print-sql with --dry-run, are usage errors.
  CHECK(run_cli(with({"migrate", "--all"})).status == exit_usage);
  CHECK(run_cli(with({"migrate", "--print-sql", "--dry-run"})).status == exit_usage);
}

DBLOCK_TEST("cli --version, and a version in every JSON output", "[cli]") {
  auto v = run_cli({"--version"});
  INFO(v);
  CHECK(v.status == 0);
  CHECK(v.out == "dblock " DBLOCK_VERSION_STRING "\n");
  CHECK(std::string(dblock::version()) == DBLOCK_VERSION_STRING);
  CHECK(versioned_json(cli(ctx, "reap", {"--json"}), 0).contains("rows_reaped"));
  versioned_json(cli(ctx, "leader", {"--json", "nobody/leads"}), exit_not_found);
  const auto m = versioned_json(cli(ctx, "migrate", {"--json"}), 0);
  CHECK(m.value("lease_durability", "") == "durable");
  // Usage errors exit 64 (EX_USAGE), also for an unknown option.
  CHECK(run_cli({"status", "--no-such-option"}).status == exit_usage);
}

// ---- verbose and the URL -----------------------------------------------------------------------

DBLOCK_TEST("cli -v: dblock's events go to stderr", "[cli]") {
  auto r = cli(ctx, "exec", {"-v", "--lock", "verbose/x", "--", "sh", "-c", "echo ran"});
  INFO(r);
  CHECK(r.status == 0);
  CHECK(r.out == "ran\n");
  CHECK(std::regex_search(r.err,
                          std::regex(R"(dblock: acquired 'verbose/x' fence \d+ in \d+ us\n)")));
  CHECK(std::regex_search(r.err, std::regex(R"(dblock: released 'verbose/x' after \d+ ms\n)")));
  const auto acquired = r.err.find("dblock: acquired 'verbose/x'");
  const auto released = r.err.find("dblock: released 'verbose/x'");
  CHECK(acquired < released);

  // A held lock: the contended event is printed too.
  held_lease hold(ctx.db, "verbose/held");
  auto busy = cli(ctx, "exec", {"--verbose", "--lock", "verbose/held", "--", "true"});
  INFO(busy);
  CHECK(busy.status == 75);
  CHECK(contains(busy.err, "dblock: 'verbose/held' is held by another owner"));

  // Without -v the library's events stay quiet.
  auto quiet = cli(ctx, "exec", {"--lock", "verbose/x", "--", "true"});
  INFO(quiet);
  CHECK(quiet.status == 0);
  CHECK(quiet.err.empty());
}

DBLOCK_TEST("cli: no --url and no DBLOCK_URL exits 64; DBLOCK_URL is the default", "[cli]") {
  for (const char* sub : {"status", "migrate", "reap"}) {
    auto r = run_cli({sub, "--table-prefix", ctx.prefix}, {"DBLOCK_URL"});
    INFO(sub << ": " << r);
    CHECK(r.status == exit_usage);
    CHECK(contains(r.err, "DBLOCK_URL"));
  }
#ifdef DBLOCK_BENCH_PATH
  auto bench = run_cli({"--table-prefix", ctx.prefix}, {"DBLOCK_URL"}, std::chrono::seconds(60),
                       DBLOCK_BENCH_PATH);
  INFO("dblock-bench: " << bench);
  CHECK(bench.status == exit_usage);
  CHECK(contains(bench.err, "DBLOCK_URL"));
#endif
  // The benchmark suite left the tool: `dblock bench` is no subcommand.
  CHECK(run_cli({"bench", "--table-prefix", ctx.prefix}, {"DBLOCK_URL"}).status == exit_usage);
  auto rel = run_cli({"release", "--force", "--table-prefix", ctx.prefix, "x"}, {"DBLOCK_URL"});
  INFO(rel);
  CHECK(rel.status == exit_usage);
  CHECK(contains(rel.err, "DBLOCK_URL"));

  held_lease hold(ctx.db, "env/held");
  auto s = run_cli({"status", "--table-prefix", ctx.prefix}, {"DBLOCK_URL=" + ctx.url});
  INFO(s);
  CHECK(s.status == 0);
  CHECK_FALSE(status_line(s.out, "env/held").empty());
}

// ---- exec --fair and waiters in status ----------------------------------------------------------

DBLOCK_TEST("cli exec --fair: queued commands run in arrival order; status shows the waiters",
            "[cli][waiting]") {
  const std::string name = "fair/job";
  const std::string out = "/tmp/dblock-fair-" + dblock::test::random_suffix(8) + ".txt";
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(20);
  lease_lock holder(ctx.db, name, lo);
  auto g = holder.try_acquire();
  REQUIRE(g);
  auto waiters = [&] {
    for (const auto& l : dblock::list_locks(ctx.db))
      if (l.name == name) return l.waiters;
    return -1;
  };
  std::vector<std::thread> runs;
  std::vector<cli_result> results(3);
  // Whatever fails below (a REQUIRE, a throw), the commands are let go and joined first: a
  // thread still joinable at unwinding would end the test run in std::terminate and hide why.
  struct let_go {
    std::optional<dblock::lease_guard>& g;
    std::vector<std::thread>& runs;
    void now() {
      try {
        if (g) g->release();
      } catch (const std::exception&) {
      }
      for (auto& t : runs)
        if (t.joinable()) t.join();
    }
    ~let_go() { now(); }
  } finish{g, runs};
  for (int i = 0; i < 3; ++i) {
    runs.emplace_back([&, i] {
      results[i] = cli(ctx, "exec",
                       {"--lock", name, "--fair", "--wait", "30s", "--", "sh", "-c",
                        "echo " + std::to_string(i) + " >> " + out});
    });
    // The next one starts only once this one is queued.
    const auto give_up = steady::now() + std::chrono::seconds(20);
    while (waiters() < i + 1 && steady::now() < give_up)
      std::this_thread::sleep_for(milliseconds(20));
    if (waiters() != i + 1) {
      finish.now();  // the holder lets go and the commands end: their outcomes say why
      for (const auto& r : results)
        UNSCOPED_INFO(r);
      FAIL("exec " << i << " never showed up in the waiter queue (" << waiters() << " waiters)");
    }
  }
  auto st = cli(ctx, "status", {"--json"});
  INFO(st);
  nlohmann::json j;
  REQUIRE_NOTHROW(j = nlohmann::json::parse(st.out));
  REQUIRE(j["locks"].size() == 1);
  CHECK(j["locks"][0]["waiters"] == 3);
  CHECK_FALSE(j["locks"][0]["head_waiter"].get<std::string>().empty());
  CHECK(j["locks"][0]["oldest_wait_ms"].get<long long>() >= 0);
  finish.now();
  for (const auto& r : results) {
    INFO(r);
    CHECK(r.status == 0);
  }
  std::ifstream in(out);
  std::stringstream ss;
  ss << in.rdbuf();
  ::unlink(out.c_str());
  CHECK(ss.str() == "0\n1\n2\n");
  CHECK(waiters() <= 0);  // every queue entry is gone (or the row is free and unlisted)
}
