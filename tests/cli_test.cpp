// The `dblock` command-line tool, run as a separate process (DBLOCK_CLI_PATH) on each backend:
// `exec` runs a command under a lease lock and maps outcomes to documented exit statuses;
// `migrate` applies the schema once.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <soci/soci.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"
#include "test_paths.hpp"

using std::chrono::milliseconds;

namespace {

using steady = std::chrono::steady_clock;

// Documented exit statuses of the CLI.
constexpr int exit_usage = 64;  // EX_USAGE
constexpr int exit_not_acquired = 75;
constexpr int exit_lease_lost = 79;
constexpr int exit_schema = 78;

struct cli_result {
  int status = -1;     // exit status, 128+signal when killed, -1 when it had to be killed
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;  // from start to exit
};

// The CLI as a child process with stdout and stderr on one pipe (like `2>&1`).
class cli_process {
 public:
  // `program` is the CLI unless given (/usr/bin/env, to run it with variables of its own).
  explicit cli_process(const std::vector<std::string>& args,
                       const std::string& program = DBLOCK_CLI_PATH) {
    dblock::test::exec_argv argv({program}, args);
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    start_ = steady::now();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dblock::test::redirect_child_stdio(fds[1], fds[1]);
      ::execv(argv[0], argv.data());
      const char msg[] = "cli_test: execv of the dblock CLI failed\n";
      (void)!::write(2, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  cli_process(const cli_process&) = delete;
  cli_process& operator=(const cli_process&) = delete;
  ~cli_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      reap();
    }
    if (fd_ >= 0) ::close(fd_);
  }

  int pid() const { return pid_; }

  // Reads output until the process exits (killing it after `timeout`).
  cli_result finish(milliseconds timeout = std::chrono::seconds(60)) {
    cli_result r;
    const auto deadline = steady::now() + timeout;
    bool killed = false;
    while (fd_ >= 0) {
      auto left = std::chrono::duration_cast<milliseconds>(deadline - steady::now()).count();
      if (left <= 0 && !killed) {
        dblock::test::describe_hung_process(pid_);
        ::kill(pid_, SIGKILL);
        killed = true;
      }
      pollfd p{fd_, POLLIN, 0};
      int n = ::poll(&p, 1, killed ? 1000 : static_cast<int>(std::min<long long>(left, 1000)));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) continue;
      char buf[4096];
      ssize_t got = ::read(fd_, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        ::close(fd_);
        fd_ = -1;
        break;
      }
      output_.append(buf, static_cast<std::size_t>(got));
    }
    r.status = reap();
    if (killed) r.status = -1;
    r.seconds = std::chrono::duration<double>(steady::now() - start_).count();
    r.output = output_;
    return r;
  }

 private:
  int reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0) {
      if (errno != EINTR) return -2;
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  int pid_ = -1;
  int fd_ = -1;
  std::string output_;
  steady::time_point start_;
};

cli_result run_cli(const std::vector<std::string>& args,
                   milliseconds timeout = std::chrono::seconds(60)) {
  cli_process p(args);
  return p.finish(timeout);
}

// `dblock exec` on this test's database: exec --url URL --table-prefix PREFIX <args...>
std::vector<std::string> exec_args(const dblock::test::context& ctx,
                                   const std::vector<std::string>& rest) {
  std::vector<std::string> a = {"exec", "--url", ctx.url, "--table-prefix", ctx.prefix};
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

// `args` (a subcommand and its arguments) on the test's database.
std::vector<std::string> on_db(const dblock::test::context& ctx, std::vector<std::string> args) {
  args.insert(args.end(), {"--url", ctx.url, "--table-prefix", ctx.prefix});
  return args;
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

std::string lock_name() {
  return "cli-" + dblock::test::random_suffix();
}

// `hosts` processes at once, each running `runs` execs one after another; args(h, i) gives run i
// of host h its arguments. CHECKs that every exec exited 0 (the first failure of each host shown).
void run_hosts(int hosts, int runs, const std::function<std::vector<std::string>(int, int)>& args) {
  std::vector<int> failures(static_cast<std::size_t>(hosts), 0);
  std::vector<std::string> first_error(static_cast<std::size_t>(hosts));
  std::vector<std::thread> threads;
  for (int h = 0; h < hosts; ++h)
    threads.emplace_back([&, h] {
      for (int i = 0; i < runs; ++i) {
        auto r = run_cli(args(h, i), std::chrono::seconds(90));
        if (r.status != 0 && failures[static_cast<std::size_t>(h)]++ == 0)
          first_error[static_cast<std::size_t>(h)] =
              "exit " + std::to_string(r.status) + ": " + r.output;
      }
    });
  for (auto& t : threads)
    t.join();
  for (int h = 0; h < hosts; ++h) {
    INFO("process " << h << ": " << first_error[static_cast<std::size_t>(h)]);
    CHECK(failures[static_cast<std::size_t>(h)] == 0);
  }
}

}  // namespace

DBLOCK_TEST("cli exec: runs the command with DBLOCK_FENCE, DBLOCK_OWNER and DBLOCK_LOCK", "[cli]") {
  const std::string name = lock_name();
  auto r = run_cli(exec_args(ctx, {"--lock", name, "--", "sh", "-c",
                                   "echo \"$DBLOCK_FENCE $DBLOCK_OWNER $DBLOCK_LOCK\""}));
  INFO(r.output);
  CHECK(r.status == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, std::regex("^([0-9]+) ([0-9a-f]{32}) (\\S+)\n")));
  CHECK(std::stoll(m[1].str()) > 0);
  CHECK(m[3].str() == name);

  // The lock was released: a second run gets it at once, with a greater fence.
  auto r2 = run_cli(exec_args(ctx, {"--lock", name, "--", "sh", "-c", "echo $DBLOCK_FENCE"}));
  INFO(r2.output);
  CHECK(r2.status == 0);
  CHECK(std::stoll(r2.output) > std::stoll(m[1].str()));
}

// What operators do: several hosts (here processes) run `dblock exec` on one lock around a
// read-sleep-write of a shared file. Through PgBouncer in transaction mode (the pgbouncer entry
// runs this too) 59 of 60 such execs used to fail on a prepared statement name.
DBLOCK_TEST("cli exec: 4 processes x 15 execs on one lock keep a counter exact", "[cli]") {
  const std::string name = lock_name();
  dblock::test::temp_dir dir("cli-counter");
  const std::string counter = dir.file("counter"), fences = dir.file("fences");
  { std::ofstream(counter) << 0 << "\n"; }
  const std::string body = "n=$(cat '" + counter + "'); sleep 0.01; echo $((n + 1)) > '" + counter +
                           "'; echo $DBLOCK_FENCE >> '" + fences + "'";
  run_hosts(4, 15, [&](int, int) {
    return exec_args(ctx, {"--lock", name, "--wait", "60s", "--", "sh", "-c", body});
  });
  long long n = -1;
  std::ifstream(counter) >> n;
  CHECK(n == 60);
  std::ifstream in(fences);
  std::vector<long long> seen;
  for (long long f; in >> f;)
    seen.push_back(f);
  CHECK(seen.size() == 60);
  CHECK(std::adjacent_find(seen.begin(), seen.end(), std::greater_equal<long long>()) ==
        seen.end());  // strictly increasing in the order the sections ran
}

// Operators limiting a job to N concurrent runs across hosts: 6 processes x 5 execs on a
// semaphore of 2 permits. Each command marks itself running in a directory shared by all (one
// file per run) and records how many it saw running: never more than 2, and at some point 2.
DBLOCK_TEST("cli exec --semaphore: 6 processes x 5 execs, never more than 2 at once",
            "[cli][semaphore]") {
  const std::string name = lock_name();
  dblock::test::temp_dir dir("cli-semaphore");
  const std::string running = dir.file("running"), seen = dir.file("seen");
  std::filesystem::create_directory(running);
  const std::string body =
      "f='" + running + "/'$$; touch \"$f\"; ls '" + running + "' | wc -l >> '" + seen +
      "'; echo \"$DBLOCK_LOCK $DBLOCK_PERMIT\" >> '" + seen + ".env'; sleep 0.15; rm -f \"$f\"";
  run_hosts(6, 5, [&](int, int) {
    return exec_args(
        ctx, {"--semaphore", name, "--permits", "2", "--wait", "60s", "--", "sh", "-c", body});
  });
  std::ifstream in(seen);
  std::vector<int> counts;
  for (int n; in >> n;)
    counts.push_back(n);
  CHECK(counts.size() == 30);
  REQUIRE_FALSE(counts.empty());
  CHECK(*std::max_element(counts.begin(), counts.end()) <= 2);
  CHECK(*std::max_element(counts.begin(), counts.end()) == 2);  // really two at once
  std::ifstream env(seen + ".env");
  std::set<std::string> lines;
  for (std::string l; std::getline(env, l);)
    lines.insert(l);
  CHECK(lines == std::set<std::string>{name + " 0", name + " 1"});
}

// Operators guarding a job that touches two resources: 4 processes x 4 execs holding the set
// {A, B}, half naming them B first. Each command does a read-sleep-write increment of a shared
// counter file: exact at the end means the sets excluded each other, and every exec exiting 0
// means no two of them waited for each other in a cycle.
DBLOCK_TEST("cli exec with several --lock: a set, exclusive, both orders never deadlock",
            "[cli][lock_set]") {
  const std::string a = lock_name(), b = a + "/b";
  dblock::test::temp_dir dir("cli-lock-set");
  const std::string counter = dir.file("counter"), env = dir.file("env");
  { std::ofstream(counter) << 0; }
  const std::string body = "n=$(cat '" + counter + "'); sleep 0.05; echo $((n+1)) > '" + counter +
                           "'; echo \"$DBLOCK_LOCK_COUNT $DBLOCK_LOCK_0 $DBLOCK_LOCK_1 " +
                           "${DBLOCK_FENCE_0:+f} ${DBLOCK_FENCE:-none}\" >> '" + env + "'";
  run_hosts(4, 4, [&](int h, int i) {  // half the execs name b first
    return exec_args(ctx, {"--lock", (h + i) % 2 ? b : a, "--lock", (h + i) % 2 ? a : b, "--wait",
                           "60s", "--", "sh", "-c", body});
  });
  long long n = -1;
  std::ifstream(counter) >> n;
  CHECK(n == 16);
  std::ifstream in(env);
  std::set<std::string> lines;
  for (std::string l; std::getline(in, l);)
    lines.insert(l);
  // The set's names in their sorted order, a fence per name, no single-lock variables.
  CHECK(lines == std::set<std::string>{"2 " + a + " " + b + " f none"});
}

DBLOCK_TEST("cli exec with several --lock: a held member exits 75 and keeps none of the set",
            "[cli][lock_set]") {
  const std::string a = lock_name(), b = a + "/b";
  dblock::test::held_lease hold(ctx.db, b);
  auto r = run_cli(exec_args(ctx, {"--lock", a, "--lock", b, "--wait", "300ms", "--", "true"}));
  INFO(r.output);
  CHECK(r.status == exit_not_acquired);
  CHECK(contains(r.output, "is held by another owner (none of them is kept)"));
  dblock::lease_lock probe(ctx.db, a);
  CHECK(probe.try_acquire());  // a was not kept
  hold.guard->release();
  auto ok = run_cli(exec_args(ctx, {"--lock", b, "--lock", a, "--", "true"}));
  INFO(ok.output);
  CHECK(ok.status == 0);
}

DBLOCK_TEST_SERVERS("cli status: a session lease shows its own fence and age once it has renewed",
                    "[cli][session_lease][direct]") {
  const std::string name = lock_name();
  dblock::lease_lock lk(ctx.db, name, {}, dblock::lease_mode::session);
  auto g = lk.try_acquire();
  REQUIRE(g);
  const std::string fence = " " + std::to_string(g->fence()) + " ";
  auto fresh = run_cli(on_db(ctx, {"status", name}));
  {
    INFO(fresh.output);
    CHECK(fresh.status == 0);
    CHECK(contains(fresh.output, " -           -     session"));  // no report yet
    CHECK_FALSE(contains(fresh.output, fence));
  }
  g->renew();  // the first renewal reports the hold
  auto renewed = run_cli(on_db(ctx, {"status", name}));
  {
    INFO(renewed.output);
    CHECK(contains(renewed.output, fence));
    CHECK(contains(renewed.output, " ago     session"));
    CHECK(contains(renewed.output, ":" + std::to_string(::getpid()) + " "));
  }
}

DBLOCK_TEST("cli leader: prints the leader or exits 1; status shows it; release --leader deposes",
            "[cli][election]") {
  const std::string name = lock_name();
  auto with = [&](std::vector<std::string> a) { return on_db(ctx, std::move(a)); };
  auto none = run_cli(with({"leader", name}));
  {
    INFO(none.output);
    CHECK(none.status == 1);
    CHECK(contains(none.output, "has no leader"));
  }
  auto none_json = run_cli(with({"leader", "--json", name}));
  CHECK(none_json.status == 1);
  CHECK(contains(none_json.output, "\"leader\": null"));
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(2);  // the watchdog notices the deposition within a second
  dblock::election e(ctx.db, name, "node-1 http://10.0.0.1", lo);
  auto l = e.try_campaign();
  REQUIRE(l);
  auto text = run_cli(with({"leader", name}));
  {
    INFO(text.output);
    CHECK(text.status == 0);
    CHECK(contains(text.output, "leader:     node-1 http://10.0.0.1"));
    CHECK(contains(text.output, "fence:      " + std::to_string(l->fence())));
  }
  auto js = run_cli(with({"leader", "--json", name}));
  {
    INFO(js.output);
    CHECK(js.status == 0);
    CHECK(contains(js.output, "\"identity\": \"node-1 http://10.0.0.1\""));
    CHECK(contains(js.output, "\"fence\": " + std::to_string(l->fence())));
  }
  auto st = run_cli(with({"status"}));
  {
    INFO(st.output);
    CHECK(contains(st.output, name + " [leader]"));
  }
  auto st_json = run_cli(with({"status", "--json"}));
  CHECK(contains(st_json.output, "\"election\": \"" + name + "\""));
  auto rel = run_cli(with({"release", "--force", "--leader", name, "--reason", "test"}));
  {
    INFO(rel.output);
    CHECK(rel.status == 0);
    CHECK(contains(rel.output, "released '" + name + " [leader]'"));
  }
  CHECK(l->lost().sleep_for(std::chrono::seconds(10)));  // the leader learns it was deposed
  auto gone = run_cli(with({"leader", name}));
  CHECK(gone.status == 1);
  auto both = run_cli(with({"release", "--force", "--leader", "--permit", "0", name}));
  CHECK(both.status == exit_usage);
}

// A cache rebuilt by one writer while many readers use it: 3 processes x 3 execs with --shared
// and 1 process x 3 execs with --lock on the same name. Each command marks itself running (one
// file per run, the kind in its name): readers see other readers, a writer never sees anyone.
DBLOCK_TEST("cli exec --shared: readers together, --lock of the same name alone", "[cli][rwlock]") {
  const std::string name = lock_name();
  dblock::test::temp_dir dir("cli-rwlock");
  const std::string running = dir.file("running"), seen = dir.file("seen");
  std::filesystem::create_directory(running);
  auto body = [&](const std::string& kind) {
    return "f='" + running + "/" + kind + "'$$; touch \"$f\"; echo " + kind + " $(ls '" + running +
           "' | wc -l) $DBLOCK_SHARED >> '" + seen + "'; sleep 0.2; rm -f \"$f\"";
  };
  run_hosts(4, 3, [&](int h, int) {
    if (h == 3)
      return exec_args(ctx, {"--lock", name, "--wait", "60s", "--", "sh", "-c", body("w")});
    return exec_args(ctx, {"--shared", name, "--wait", "60s", "--", "sh", "-c", body("r")});
  });
  std::ifstream in(seen);
  int readers = 0, writers = 0, most_readers = 0;
  for (std::string kind, shared; in >> kind;) {
    int n = 0;
    in >> n;
    if (kind == "w") {
      ++writers;
      CHECK(n == 1);  // alone
      continue;
    }
    in >> shared;
    CHECK(shared == "1");
    ++readers;
    most_readers = std::max(most_readers, n);
  }
  CHECK(readers == 9);
  CHECK(writers == 3);
  CHECK(most_readers >= 2);  // readers really shared
}

DBLOCK_TEST("cli exec --shared: a writer in exits 75; status and release --reader",
            "[cli][rwlock]") {
  const std::string name = lock_name();
  dblock::rwlock rw(ctx.db, name);
  auto w = rw.try_acquire();
  REQUIRE(w);
  auto busy = run_cli(exec_args(ctx, {"--shared", name, "--", "true"}));
  {
    INFO(busy.output);
    CHECK(busy.status == exit_not_acquired);
    CHECK(contains(busy.output, "is held or awaited by a writer"));
  }
  w->release();
  auto r = rw.try_acquire_shared();
  REQUIRE(r);
  auto writer = run_cli(exec_args(ctx, {"--lock", name, "--", "true"}));
  {
    INFO(writer.output);
    CHECK(writer.status == exit_not_acquired);  // a reader is in
  }
  const int slot = dblock::rwlock::reader_of(r->name())->second;
  auto with = [&](std::vector<std::string> a) { return on_db(ctx, std::move(a)); };
  auto st = run_cli(with({"status"}));
  {
    INFO(st.output);
    CHECK(contains(st.output, name + " [reader " + std::to_string(slot) + "]"));
  }
  auto rel = run_cli(with({"release", "--force", "--reader", std::to_string(slot), name}));
  {
    INFO(rel.output);
    CHECK(rel.status == 0);
  }
  auto now_free = run_cli(exec_args(ctx, {"--lock", name, "--", "true"}));
  CHECK(now_free.status == 0);
  auto both = run_cli(exec_args(ctx, {"--lock", name, "--shared", name, "--", "true"}));
  CHECK(both.status == exit_usage);
}

DBLOCK_TEST("cli exec --semaphore: all permits held exits 75; another count exits 64",
            "[cli][semaphore]") {
  const std::string name = lock_name();
  dblock::semaphore sem(ctx.db, name, 1);
  auto g = sem.try_acquire();
  REQUIRE(g);
  auto held = run_cli(
      exec_args(ctx, {"--semaphore", name, "--permits", "1", "--wait", "0s", "--", "true"}));
  {
    INFO(held.output);
    CHECK(held.status == exit_not_acquired);
    CHECK(contains(held.output, "all 1 permits of semaphore '" + name + "' are held"));
  }
  auto other = run_cli(
      exec_args(ctx, {"--semaphore", name, "--permits", "3", "--wait", "0s", "--", "true"}));
  {
    INFO(other.output);
    CHECK(other.status == exit_usage);
    CHECK(contains(other.output, "declared with 1 permits, not 3"));
  }
  auto both = run_cli(
      exec_args(ctx, {"--lock", name, "--semaphore", name, "--permits", "1", "--", "true"}));
  {
    INFO(both.output);
    CHECK(both.status == exit_usage);
  }
  auto no_count = run_cli(exec_args(ctx, {"--semaphore", name, "--", "true"}));
  {
    INFO(no_count.output);
    CHECK(no_count.status == exit_usage);
  }
  // status names the permit; release --force --permit frees it (the holder then lost it).
  auto with = [&](std::vector<std::string> a) { return on_db(ctx, std::move(a)); };
  auto st = run_cli(with({"status"}));
  {
    INFO(st.output);
    CHECK(st.status == 0);
    CHECK(contains(st.output, name + " [permit 0]"));
  }
  auto js = run_cli(with({"status", "--json"}));
  {
    INFO(js.output);
    CHECK(contains(js.output, "\"semaphore\": \"" + name + "\""));
    CHECK(contains(js.output, "\"permit\": 0"));
  }
  auto none = run_cli(with({"release", "--force", "--permit", "5", name}));
  {
    INFO(none.output);
    CHECK(none.status == 1);
    CHECK(contains(none.output, "has no permit 5"));
  }
  auto forced = run_cli(with({"release", "--force", "--permit", "0", "--reason", "stuck", name}));
  {
    INFO(forced.output);
    CHECK(forced.status == 0);
    CHECK(contains(forced.output, "released '" + name + " [permit 0]'"));
  }
  CHECK(dblock::test::code_of([&] { g->release(); }) == dblock::errc::lease_lost);
  auto free =
      run_cli(exec_args(ctx, {"--semaphore", name, "--permits", "1", "--", "sh", "-c", "exit 4"}));
  INFO(free.output);
  CHECK(free.status == 4);
}

DBLOCK_TEST("cli exec: passes the command's exit status through", "[cli]") {
  auto r = run_cli(exec_args(ctx, {"--lock", lock_name(), "--", "sh", "-c", "exit 7"}));
  INFO(r.output);
  CHECK(r.status == 7);
}

DBLOCK_TEST("cli exec: a held lock exits 75, with and without --wait", "[cli]") {
  const std::string name = lock_name();
  dblock::test::held_lease hold(ctx.db, name);

  auto now = run_cli(exec_args(ctx, {"--lock", name, "--wait", "0s", "--", "true"}));
  {
    INFO(now.output);
    CHECK(now.status == exit_not_acquired);
    CHECK(contains(now.output, "lock '" + name + "' is held by another owner"));
    CHECK(contains(now.output, "not running the command"));
  }

  auto waited = run_cli(exec_args(ctx, {"--lock", name, "--wait", "1s", "--", "true"}));
  {
    INFO(waited.output << " (" << waited.seconds << " s)");
    CHECK(waited.status == exit_not_acquired);
    CHECK(contains(waited.output, "was not freed within 1s"));
    CHECK(waited.seconds >= 1.0);
  }

  CHECK(hold.guard->valid());
  hold.guard->release();
  auto free = run_cli(exec_args(ctx, {"--lock", name, "--wait", "0s", "--", "true"}));
  INFO(free.output);
  CHECK(free.status == 0);
}

DBLOCK_TEST("cli exec --wait: acquires when the holder releases during the wait", "[cli]") {
  const std::string name = lock_name();
  dblock::test::held_lease hold(ctx.db, name);
  const long long held_fence = hold.guard->fence();
  const auto start = steady::now();
  std::string release_error;
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(500));
    try {
      hold.guard->release();
    } catch (const std::exception& e) {
      release_error = e.what();
    }
  });
  auto r = run_cli(
      exec_args(ctx, {"--lock", name, "--wait", "10s", "--", "sh", "-c", "echo $DBLOCK_FENCE"}));
  releaser.join();
  double seconds = std::chrono::duration<double>(steady::now() - start).count();
  INFO(r.output << " (" << seconds << " s)");
  CHECK(release_error.empty());
  REQUIRE(r.status == 0);
  CHECK(std::stoll(r.output) > held_fence);
  CHECK(seconds >= 0.5);  // it cannot have run before the release
}

// The lease is made lost by force: the row's expiry is moved into the past and the test takes
// the lease over. The CLI's watchdog (ttl 1 s, renewing every ~333 ms) then fails to renew, so
// the CLI must SIGTERM `sleep 30`, say so on stderr and exit 79 within a few seconds.
DBLOCK_TEST("cli exec: a lost lease terminates the command and exits 79", "[cli]") {
  const std::string name = lock_name();
  cli_process cli(exec_args(ctx, {"--lock", name, "--ttl", "1s", "--", "sleep", "30"}));

  // Wait until the CLI holds the lease.
  bool held = false;
  for (auto deadline = steady::now() + std::chrono::seconds(20); steady::now() < deadline;) {
    auto c = ctx.db.connect();
    auto row = dblock::test::read_lease(c, name);
    if (row && row->hold_count > 0 && row->expires_at_us > row->now_us) {
      held = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  REQUIRE(held);

  {
    auto c = ctx.db.connect();
    long long minus_hour_us = -3600LL * 1000000LL;
    c.session() << "UPDATE " << ctx.db.lock_table() << " SET expires_at = "
                << dblock::test::dialect_of(ctx.db).sql.plus_us(
                       dblock::test::dialect_of(ctx.db).sql.now(), "d")
                << " WHERE resource_name = :name",
        soci::use(minus_hour_us, "d"), soci::use(name, "name");
  }
  dblock::test::held_lease hold(ctx.db, name);
  const auto taken = steady::now();

  auto r = cli.finish(std::chrono::seconds(40));
  double after_takeover = std::chrono::duration<double>(steady::now() - taken).count();
  INFO(r.output << " (" << after_takeover << " s after the takeover)");
  CHECK(r.status == exit_lease_lost);
  CHECK(contains(r.output, "lost"));
  CHECK(contains(r.output, "SIGTERM"));
  CHECK(after_takeover < 5.0);
  // The CLI left the successor's lease alone.
  CHECK(hold.guard->valid());
  CHECK_NOTHROW(hold.guard->release());
}

DBLOCK_TEST("cli exec: an unmigrated prefix exits 78 and says to run dblock migrate", "[cli]") {
  const std::string fresh = ctx.new_prefix();
  auto r = run_cli(
      {"exec", "--url", ctx.url, "--table-prefix", fresh, "--lock", lock_name(), "--", "true"});
  INFO(r.output);
  CHECK(r.status == exit_schema);
  CHECK(contains(r.output, "dblock migrate"));
}

DBLOCK_TEST("cli exec: a bad URL exits 64, a missing command 127", "[cli]") {
  auto bad = run_cli({"exec", "--url", "nonsense://x", "--lock", "x", "--", "true"});
  {
    INFO(bad.output);
    CHECK(bad.status == exit_usage);
    CHECK(contains(bad.output, "nonsense"));
  }
  auto missing =
      run_cli(exec_args(ctx, {"--lock", lock_name(), "--",
                              "dblock-test-no-such-command-" + dblock::test::random_suffix()}));
  INFO(missing.output);
  CHECK(missing.status == 127);
  CHECK(contains(missing.output, "cannot run"));
}

DBLOCK_TEST("cli migrate: applies a fresh prefix once, then nothing", "[cli]") {
  const std::string fresh = ctx.new_prefix();
  auto first = run_cli({"migrate", "--url", ctx.url, "--table-prefix", fresh});
  {
    INFO(first.output);
    REQUIRE(first.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(first.output, m, std::regex("([0-9]+) migration\\(s\\) applied")));
    CHECK(std::stoi(m[1].str()) > 0);
    CHECK(contains(first.output, "applied now"));
  }
  auto second = run_cli({"migrate", "--url", ctx.url, "--table-prefix", fresh});
  {
    INFO(second.output);
    CHECK(second.status == 0);
    CHECK(contains(second.output, "0 migration(s) applied"));
    CHECK_FALSE(contains(second.output, "applied now"));
  }
  // The migrated prefix works for exec.
  auto r = run_cli(
      {"exec", "--url", ctx.url, "--table-prefix", fresh, "--lock", lock_name(), "--", "true"});
  INFO(r.output);
  CHECK(r.status == 0);
}

DBLOCK_TEST("cli migrate --lease-durability: fast on PostgreSQL, a clear refusal elsewhere",
            "[cli][durability][direct]") {
  const std::string fresh = ctx.new_prefix();
  auto durable = run_cli({"migrate", "--url", ctx.url, "--table-prefix", fresh});
  {
    INFO(durable.output);
    REQUIRE(durable.status == 0);
    CHECK(contains(durable.output, "resource_lock: durable"));
  }
  auto fast =
      run_cli({"migrate", "--url", ctx.url, "--table-prefix", fresh, "--lease-durability", "fast"});
  INFO(fast.output);
  if (ctx.backend == "postgresql") {
    CHECK(fast.status == 0);
    CHECK(contains(fast.output, "resource_lock: fast"));
    // exec on the fast table: a fence above the first epoch.
    auto r = run_cli({"exec", "--url", ctx.url, "--table-prefix", fresh, "--lock", lock_name(),
                      "--", "sh", "-c", "echo fence=$DBLOCK_FENCE"});
    INFO(r.output);
    CHECK(r.status == 0);
    std::smatch m;
    REQUIRE(std::regex_search(r.output, m, std::regex("fence=([0-9]+)")));
    CHECK(std::stoll(m[1].str()) >= (1LL << 32));
    auto back = run_cli(
        {"migrate", "--url", ctx.url, "--table-prefix", fresh, "--lease-durability", "durable"});
    INFO(back.output);
    CHECK(back.status == 0);
    CHECK(contains(back.output, "resource_lock: durable"));
  } else {
    CHECK(fast.status != 0);
    CHECK(contains(fast.output, "fast lease mode is not available on " + ctx.backend));
  }
  auto bad = run_cli(
      {"migrate", "--url", ctx.url, "--table-prefix", fresh, "--lease-durability", "quick"});
  INFO(bad.output);
  CHECK(bad.status == exit_usage);
}

DBLOCK_TEST("cli exec and status: a TTL below the failover window is warned about",
            "[cli][failover]") {
  const std::string name = lock_name();
  const std::string url = ctx.url + (contains(ctx.url, "?") ? "&" : "?") + "failover_window=4s";
  auto args = [&](std::vector<std::string> rest) {
    std::vector<std::string> a = {"exec", "--url", url, "--table-prefix", ctx.prefix};
    a.insert(a.end(), rest.begin(), rest.end());
    return a;
  };
  auto r = run_cli(args({"--lock", name, "--ttl", "5s", "--", "true"}));
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "dblock: warning: lease '" + name + "' has a TTL of 5000 ms"));
  CHECK(contains(r.output, "ms survives that"));
  // Control: a TTL above it, and the same TTL without the window, say nothing.
  auto quiet = run_cli(args({"--lock", name, "--ttl", "10s", "--", "true"}));
  INFO(quiet.output);
  CHECK(quiet.status == 0);
  CHECK(quiet.output.empty());
  auto plain = run_cli(exec_args(ctx, {"--lock", name, "--ttl", "5s", "--", "true"}));
  INFO(plain.output);
  CHECK(plain.status == 0);
  CHECK(plain.output.empty());

  auto st = run_cli({"status", "--url", url, "--table-prefix", ctx.prefix});
  INFO(st.output);
  CHECK(st.status == 0);
  CHECK(contains(st.output, "failover window 4.0s (database_options::failover_window"));
  CHECK(contains(st.output, "with a TTL of at least 7.1s"));
  auto js = run_cli({"status", "--json", "--url", url, "--table-prefix", ctx.prefix});
  INFO(js.output);
  CHECK(contains(js.output, "\"window_ms\": 4000"));
  auto none = run_cli(on_db(ctx, {"status"}));
  INFO(none.output);
  CHECK_FALSE(contains(none.output, "failover window"));
}

// ---- the command's whole process tree lives with the lease ------------------------------------

namespace {

// True while process `pid` runs (a zombie has ended: only its exit status is left).
bool running(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

std::vector<int> read_pids(const std::string& path) {
  std::vector<int> out;
  std::istringstream in(dblock::test::read_file(path));
  for (int p; in >> p;)
    out.push_back(p);
  return out;
}

// Waits until the command wrote `n` pids into `path`.
std::vector<int> wait_pids(const std::string& path, std::size_t n) {
  for (auto deadline = steady::now() + std::chrono::seconds(60); steady::now() < deadline;) {
    auto pids = read_pids(path);
    if (pids.size() >= n) return pids;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return read_pids(path);
}

std::vector<int> still_running(const std::vector<int>& pids) {
  std::vector<int> out;
  for (int p : pids)
    if (running(p)) out.push_back(p);
  return out;
}

// A pipeline with a grandchild that ignores SIGTERM: the shell ($$) and the grandchild (a loop
// that appends the time to `beats` every 20 ms) write their pids into `pids`.
std::string tree_command(const dblock::test::temp_dir& dir) {
  return "echo $$ >> " + dir.file("pids") + "; (trap '' TERM; while :; do date +%s%N >> " +
         dir.file("beats") + "; sleep 0.02; done & echo $! >> " + dir.file("pids") +
         "; wait) | cat";
}

long long last_beat(const dblock::test::temp_dir& dir) {
  std::istringstream in(dblock::test::read_file(dir.file("beats")));
  long long last = 0;
  for (long long t; in >> t;)
    last = t;
  return last;
}

}  // namespace

// dblock dies by SIGKILL while its command runs: its supervisor sends the whole tree SIGTERM and
// SIGKILL after --kill-after (a sixth of the TTL), all of it gone well before the lease, renewed
// at most a third of the TTL before the kill, can expire. A second exec waiting for the lock
// gets it only after that: the grandchild's last beat comes before the second command starts.
DBLOCK_TEST(
    "cli exec: kill -9 of dblock ends the command's whole tree before the lease can "
    "expire, and the next holder never overlaps it",
    "[cli][exec-tree]") {
  dblock::test::temp_dir dir("exec-tree");
  const std::string name = lock_name();
  const milliseconds ttl(6000);
  cli_process first(
      exec_args(ctx, {"--lock", name, "--ttl", "6s", "--", "sh", "-c", tree_command(dir)}));
  const auto pids = wait_pids(dir.file("pids"), 2);
  REQUIRE(pids.size() == 2);
  REQUIRE(dblock::test::wait_for_file(dir.file("beats"), std::chrono::seconds(30)));
  CHECK(still_running(pids).size() == 2);

  ::kill(first.pid(), SIGKILL);
  const auto killed = steady::now();
  cli_process second(exec_args(ctx, {"--lock", name, "--wait", "120s", "--", "sh", "-c",
                                     "date +%s%N > " + dir.file("second")}));
  std::vector<int> left = pids;
  while (!left.empty() && steady::now() - killed < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(milliseconds(5));
    left = still_running(left);
  }
  const auto gone_ms = std::chrono::duration_cast<milliseconds>(steady::now() - killed).count();
  auto r1 = first.finish(std::chrono::seconds(10));
  INFO("first: " << r1.output << "; tree gone " << gone_ms << " ms after the kill");
  CHECK(left.empty());
  // The safety bound: the lease was renewed at most ttl/3 before the kill, so it runs at least
  // 2/3 of the TTL after it; the tree must be gone by then.
  CHECK(gone_ms < ttl.count() * 2 / 3);
  CHECK(contains(r1.output, "ended while the command ran"));

  auto r2 = second.finish(std::chrono::seconds(150));
  INFO("second: " << r2.output);
  REQUIRE(r2.status == 0);
  const long long second_start = std::stoll(dblock::test::read_file(dir.file("second")));
  CHECK(last_beat(dir) > 0);
  CHECK(last_beat(dir) < second_start);
}

// Control: the same tree under a plain parent, as `dblock exec` ran it before the supervisor.
// SIGKILL of the parent leaves the grandchild running (and beating): the checks above can fail.
TEST_CASE("cli exec control: under a plain fork, the grandchild outlives its killed parent",
          "[cli][exec-tree][control]") {
  dblock::test::temp_dir dir("exec-tree-control");
  const std::string cmd = tree_command(dir);
  const pid_t parent = ::fork();
  REQUIRE(parent >= 0);
  if (parent == 0) {
    ::setpgid(0, 0);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto pids = wait_pids(dir.file("pids"), 2);
  REQUIRE(pids.size() == 2);
  ::kill(parent, SIGKILL);
  ::waitpid(parent, nullptr, 0);
  // Twice the supervisor's kill-after at the 6 s TTL above.
  std::this_thread::sleep_for(milliseconds(2000));
  const long long beat = last_beat(dir);
  std::this_thread::sleep_for(milliseconds(500));
  const auto left = still_running(pids);
  CHECK(left.size() == 1);       // the grandchild, unguarded
  CHECK(last_beat(dir) > beat);  // and still working
  for (int p : left)
    ::kill(p, SIGKILL);
  ::kill(-parent, SIGKILL);  // its group: cat, the loop's sleep
}

// A forced release makes the lease lost: the whole tree is ended, the grandchild that ignores
// SIGTERM by SIGKILL, before dblock exits 79.
DBLOCK_TEST("cli exec: a forced release ends the command's whole tree before dblock exits 79",
            "[cli][exec-tree]") {
  dblock::test::temp_dir dir("exec-tree-release");
  const std::string name = lock_name();
  cli_process cli(
      exec_args(ctx, {"--lock", name, "--ttl", "3s", "--", "sh", "-c", tree_command(dir)}));
  const auto pids = wait_pids(dir.file("pids"), 2);
  REQUIRE(pids.size() == 2);
  auto rel = run_cli(on_db(ctx, {"release", "--force", "--reason", "test", name}));
  INFO(rel.output);
  CHECK(rel.status == 0);
  auto r = cli.finish(std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.status == exit_lease_lost);
  CHECK(still_running(pids).empty());
}

// A process the command leaves behind (a background job that ignores SIGTERM) is ended before
// the lease is released: nothing of the tree runs once dblock has exited.
DBLOCK_TEST("cli exec: processes the command leaves behind are ended before the release",
            "[cli][exec-tree]") {
  dblock::test::temp_dir dir("exec-tree-left");
  const std::string name = lock_name();
  auto r =
      run_cli(exec_args(ctx, {"--lock", name, "--ttl", "3s", "--", "sh", "-c",
                              "(trap '' TERM; exec sleep 600) & echo $! > " + dir.file("pids")}));
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(contains(r.output, "left 1 process"));
  const auto pids = read_pids(dir.file("pids"));
  REQUIRE(pids.size() == 1);
  CHECK_FALSE(running(pids[0]));
  auto again = run_cli(exec_args(ctx, {"--lock", name, "--", "true"}));
  CHECK(again.status == 0);  // released
}

// A signal dblock gets reaches every process of the tree, a grandchild included.
DBLOCK_TEST("cli exec: a signal to dblock is passed on to the command's whole tree",
            "[cli][exec-tree]") {
  dblock::test::temp_dir dir("exec-tree-signal");
  const std::string child = "trap 'echo child > " + dir.file("child") + "; exit 0' USR1; ";
  const std::string grandchild = "trap '' TERM; trap 'echo grandchild > " + dir.file("grandchild") +
                                 "; exit 0' USR1; touch " + dir.file("ready") +
                                 "; while :; do sleep 0.05; done";
  cli_process cli(exec_args(
      ctx, {"--lock", lock_name(), "--", "sh", "-c",
            child + "sh -c \"" + grandchild + "\" & wait; while :; do sleep 0.05; done"}));
  REQUIRE(dblock::test::wait_for_file(dir.file("ready"), std::chrono::seconds(60)));
  ::kill(cli.pid(), SIGUSR1);
  auto r = cli.finish(std::chrono::seconds(60));
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(dblock::test::read_file(dir.file("child")) == "child\n");
  CHECK(dblock::test::read_file(dir.file("grandchild")) == "grandchild\n");
}

DBLOCK_TEST("cli exec: --kill-after longer than a third of --ttl is refused", "[cli][exec-tree]") {
  auto r = run_cli(
      exec_args(ctx, {"--lock", lock_name(), "--ttl", "30s", "--kill-after", "11s", "--", "true"}));
  INFO(r.output);
  CHECK(r.status == exit_usage);
  CHECK(contains(r.output, "a third of --ttl"));
}

// ---- exec as a Unix tool ----------------------------------------------------------------------

DBLOCK_TEST("cli exec -c runs a shell command line under the lock", "[cli][exec-unix]") {
  auto r = run_cli(
      exec_args(ctx, {"--lock", lock_name(), "-c", "echo \"fence $DBLOCK_FENCE\" | tr a-z A-Z"}));
  INFO(r.output);
  CHECK(r.status == 0);
  CHECK(std::regex_search(r.output, std::regex("FENCE [0-9]+")));
  auto both = run_cli(exec_args(ctx, {"--lock", lock_name(), "-c", "true", "--", "true"}));
  CHECK(both.status == exit_usage);
  auto none = run_cli(exec_args(ctx, {"--lock", lock_name()}));
  INFO(none.output);
  CHECK(none.status == exit_usage);
  CHECK(contains(none.output, "no command"));
}

DBLOCK_TEST("cli exec -E chooses the status of a busy lock (75 without it)", "[cli][exec-unix]") {
  const std::string name = lock_name();
  dblock::test::held_lease hold(ctx.db, name);
  auto chosen = run_cli(exec_args(ctx, {"--lock", name, "-E", "3", "--", "true"}));
  INFO(chosen.output);
  CHECK(chosen.status == 3);
  CHECK(run_cli(exec_args(ctx, {"--lock", name, "--", "true"})).status == exit_not_acquired);
  CHECK(run_cli(exec_args(ctx, {"--lock", name, "-E", "256", "--", "true"})).status == exit_usage);
}

DBLOCK_TEST("cli exec --wait forever acquires when the holder releases", "[cli][exec-unix]") {
  const std::string name = lock_name();
  dblock::test::held_lease hold(ctx.db, name);
  std::thread releaser([&] {
    std::this_thread::sleep_for(milliseconds(800));
    hold.guard->release();
  });
  auto r = run_cli(
      exec_args(ctx, {"--lock", name, "--wait", "forever", "--", "sh", "-c", "echo $DBLOCK_FENCE"}),
      std::chrono::seconds(120));
  releaser.join();
  INFO(r.output);
  REQUIRE(r.status == 0);
  CHECK(std::stoll(r.output) > 0);
}

// A subcommand run with --json answers an error with a JSON object on stdout too.
DBLOCK_TEST("cli --json: an error is a JSON object with its kind and exit status",
            "[cli][exec-unix]") {
  auto bad = run_cli({"status", "--json", "--url", "nonsense://x"});
  INFO(bad.output);
  CHECK(bad.status == exit_usage);
  const auto brace = bad.output.find('{');
  REQUIRE(brace != std::string::npos);
  auto j = nlohmann::json::parse(bad.output.substr(brace));
  CHECK(j.at("error").at("kind") == "invalid_argument");
  CHECK(j.at("error").at("exit_status") == exit_usage);
  CHECK(contains(j.at("error").at("message").get<std::string>(), "nonsense"));

  auto missing = run_cli(
      {"leader", "--json", "--url", ctx.url, "--table-prefix", ctx.new_prefix(), "some-election"});
  INFO(missing.output);
  CHECK(missing.status == exit_schema);
  const auto b2 = missing.output.find('{');
  REQUIRE(b2 != std::string::npos);
  CHECK(nlohmann::json::parse(missing.output.substr(b2)).at("error").at("kind") ==
        "schema_missing");
}

// ---- runs the database records: exec --once, exec --every, dblock runs ------------------------

namespace {

// `n` CLI processes started at once; their results in start order.
std::vector<cli_result> run_together(int n,
                                     const std::function<std::vector<std::string>(int)>& args) {
  std::vector<std::unique_ptr<cli_process>> ps;
  for (int i = 0; i < n; ++i)
    ps.push_back(std::make_unique<cli_process>(args(i)));
  std::vector<cli_result> out;
  for (auto& p : ps)
    out.push_back(p->finish(std::chrono::seconds(300)));
  return out;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::vector<std::string> out;
  std::istringstream in(dblock::test::read_file(path));
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

}  // namespace

// Eight hosts run a deploy step with --once at the same moment: one runs it; the seven others
// wait for its outcome and exit 0 without running it. The runs table has its one success.
DBLOCK_TEST("cli exec --once: of 8 processes at once, one runs the command, 7 exit 0 after it",
            "[cli][runs]") {
  dblock::test::temp_dir dir("exec-once");
  const std::string key = "once-" + dblock::test::random_suffix();
  auto rs = run_together(8, [&](int) {
    return exec_args(ctx, {"--once", key, "--wait", "120s", "--", "sh", "-c",
                           "echo $DBLOCK_FENCE >> " + dir.file("runs") + "; sleep 0.3"});
  });
  for (const auto& r : rs) {
    INFO(r.output);
    CHECK(r.status == 0);
  }
  CHECK(lines_of(dir.file("runs")).size() == 1);
  const auto recorded = dblock::list_runs(ctx.db, key);
  REQUIRE(recorded.size() == 1);
  CHECK(recorded[0].succeeded);
  CHECK(recorded[0].exit_status == 0);
  CHECK(std::to_string(recorded[0].fence) == lines_of(dir.file("runs")).at(0));
}

// Control: the same eight processes holding the lock without the record (plain --lock) run the
// command eight times, one after another.
DBLOCK_TEST("cli exec control: without the run record, 8 processes run the command 8 times",
            "[cli][runs][control]") {
  dblock::test::temp_dir dir("exec-once-control");
  const std::string name = lock_name();
  auto rs = run_together(8, [&](int) {
    return exec_args(ctx, {"--lock", name, "--wait", "120s", "--", "sh", "-c",
                           "echo $DBLOCK_FENCE >> " + dir.file("runs")});
  });
  for (const auto& r : rs)
    CHECK(r.status == 0);
  CHECK(lines_of(dir.file("runs")).size() == 8);
}

// The first run fails (exit 3): exactly one of the waiters runs it again and succeeds; every
// other process exits 0 without running it.
DBLOCK_TEST("cli exec --once: a failed first run is retried by exactly one waiter", "[cli][runs]") {
  dblock::test::temp_dir dir("exec-once-fail");
  const std::string key = "once-" + dblock::test::random_suffix();
  const std::string cmd = "if mkdir " + dir.file("first") + " 2>/dev/null; then exit 3; fi; echo " +
                          "ok >> " + dir.file("runs");
  auto rs = run_together(8, [&](int) {
    return exec_args(ctx, {"--once", key, "--wait", "120s", "-c", cmd});
  });
  int failed = 0, ok = 0;
  for (const auto& r : rs) {
    INFO(r.output);
    if (r.status == 3) ++failed;
    if (r.status == 0) ++ok;
  }
  CHECK(failed == 1);
  CHECK(ok == 7);
  CHECK(lines_of(dir.file("runs")).size() == 1);
  const auto recorded = dblock::list_runs(ctx.db, key);
  REQUIRE(recorded.size() == 2);
  CHECK(recorded[0].succeeded);  // newest first
  CHECK_FALSE(recorded[1].succeeded);
  CHECK(recorded[1].exit_status == 3);
}

// The runner is killed (kill -9 of dblock): its tree ends, its run has no end, and the next
// waiter runs the command once the lease expired, after the killed run's last beat. For --once
// and for --every (a slot of 87600 h, ten years: the test never straddles its end).
DBLOCK_TEST("cli exec --once / --every: a killed runner's run is retried, never at the same time",
            "[cli][runs]") {
  for (const bool every : {false, true}) {
    INFO((every ? "--every" : "--once"));
    dblock::test::temp_dir dir("exec-run-kill");
    const std::string key = "run-" + dblock::test::random_suffix();
    const std::vector<std::string> run =
        every ? std::vector<std::string>{"--every", "87600h", "--lock", key}
              : std::vector<std::string>{"--once", key};
    auto with = [&](std::vector<std::string> rest) {
      std::vector<std::string> a = run;
      a.insert(a.end(), rest.begin(), rest.end());
      return exec_args(ctx, a);
    };
    cli_process first(with({"--ttl", "3s", "--", "sh", "-c", tree_command(dir)}));
    REQUIRE(wait_pids(dir.file("pids"), 2).size() == 2);
    REQUIRE(dblock::test::wait_for_file(dir.file("beats"), std::chrono::seconds(30)));
    ::kill(first.pid(), SIGKILL);
    auto second =
        run_cli(with({"--wait", "120s", "--", "sh", "-c", "date +%s%N > " + dir.file("second")}),
                std::chrono::seconds(150));
    INFO(second.output);
    REQUIRE(second.status == 0);
    CHECK(last_beat(dir) < std::stoll(dblock::test::read_file(dir.file("second"))));
    const auto recorded = dblock::list_runs(ctx.db, key);
    REQUIRE(recorded.size() == 2);
    CHECK(recorded[0].succeeded);
    CHECK(recorded[0].slot == recorded[1].slot);    // retried in the same slot
    CHECK_FALSE(recorded[1].ended_at.has_value());  // the killed run recorded no end
    // Done now: a third exits 0 without running.
    CHECK(run_cli(with({"--", "false"})).status == 0);
  }
}

// `dblock runs` lists them; --forget lets the key run again (audited: who, when, why).
DBLOCK_TEST("cli runs: lists the runs, --forget allows a rerun and is recorded", "[cli][runs]") {
  const std::string key = "once-" + dblock::test::random_suffix();
  CHECK(run_cli(exec_args(ctx, {"--once", key, "--", "true"})).status == 0);
  auto js = run_cli(on_db(ctx, {"runs", "--json", key}));
  INFO(js.output);
  REQUIRE(js.status == 0);
  auto j = nlohmann::json::parse(js.output);
  REQUIRE(j.at("runs").size() == 1);
  CHECK(j["runs"][0].at("succeeded") == true);
  CHECK(run_cli(on_db(ctx, {"runs", "--forget", key})).status == exit_usage);  // no --reason
  auto forgot = run_cli(on_db(ctx, {"runs", "--forget", "--reason", "redo it", key}));
  INFO(forgot.output);
  CHECK(forgot.status == 0);
  auto again = run_cli(exec_args(ctx, {"--once", key, "--", "sh", "-c", "echo ran again"}));
  CHECK(contains(again.output, "ran again"));
  const auto recorded = dblock::list_runs(ctx.db, key);
  REQUIRE(recorded.size() == 2);
  CHECK(recorded[1].forgotten_at.has_value());
  CHECK(recorded[1].forget_reason == "redo it");
  CHECK_FALSE(recorded[0].forgotten_at.has_value());
}

namespace {

// Four processes whose clocks are 5 and 2 minutes behind and ahead (libfaketime; not on
// SQLite, whose database clock is each process's own: one host per file, docs/safety.md), each
// running `exec ARGS` every 150 ms until `enough()` (at most 120 s), or once each when `enough`
// is empty. Returns the first failed exit's output ("" when every exit was 0).
std::string fire_skewed(const dblock::test::context& ctx, const std::vector<std::string>& args,
                        const std::function<bool()>& enough) {
  const bool once = !enough;
  const std::string lib = dblock::test::faketime_lib();
  if (lib.empty()) return "libfaketime is not installed (the faketime package)";
  const char* skews[] = {"-5m", "-2m", "+2m", "+5m"};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::string first_bad;
  std::vector<std::thread> hosts;
  for (const char* skew : skews)
    hosts.emplace_back([&, skew] {
      std::vector<std::string> a;  // /usr/bin/env VAR=... dblock exec ...
      if (ctx.backend != "sqlite")
        a = {"LD_PRELOAD=" + lib, std::string("FAKETIME=") + skew, "FAKETIME_DONT_FAKE_MONOTONIC=1",
             "DONT_FAKE_MONOTONIC=1"};
      a.push_back(DBLOCK_CLI_PATH);
      for (const auto& s : exec_args(ctx, args))
        a.push_back(s);
      do {
        auto r = cli_process(a, "/usr/bin/env").finish(std::chrono::seconds(60));
        if (r.status != 0) {
          std::lock_guard<std::mutex> lk(mu);
          if (first_bad.empty()) first_bad = "exit " + std::to_string(r.status) + ": " + r.output;
        }
        if (!once) std::this_thread::sleep_for(milliseconds(150));
      } while (!once && !stop);
    });
  for (auto end = steady::now() + std::chrono::seconds(120);
       !once && steady::now() < end && !enough();)
    std::this_thread::sleep_for(milliseconds(100));
  stop = true;
  for (auto& t : hosts)
    t.join();
  return first_bad;
}

std::size_t distinct(const std::vector<std::string>& v) {
  return std::set<std::string>(v.begin(), v.end()).size();
}

}  // namespace

// Four skewed processes fire `exec --every 1s`: one success per slot of the database clock,
// never two, until six slots had theirs.
DBLOCK_TEST(
    "cli exec --every: one success per slot of the database clock, whatever the hosts' "
    "clocks",
    "[cli][runs]") {
  dblock::test::temp_dir dir("exec-every");
  const std::string name = lock_name();
  const std::string bad = fire_skewed(ctx,
                                      {"--every", "1s", "--lock", name, "--wait", "30s", "-c",
                                       "echo $DBLOCK_SLOT >> " + dir.file("runs")},
                                      [&] { return distinct(lines_of(dir.file("runs"))) >= 6; });
  INFO(bad);
  CHECK(bad.empty());
  const auto v = lines_of(dir.file("runs"));
  INFO(v.size() << " runs in " << distinct(v) << " slots");
  CHECK(distinct(v) >= 6);
  CHECK(v.size() == distinct(v));  // never two runs in one slot
  for (const auto& run : dblock::list_runs(ctx.db, name, 1000))
    CHECK(run.succeeded);
}

// Control: a 10-minute schedule with the slot taken from each host's clock (as a job that checks
// "done for this slot?" by its own clock would), each of the four hosts firing once at the same
// moment. The hosts 5 minutes behind and ahead are 10 minutes apart, so they always see two
// different slots: the job runs at least twice in one real moment, deterministically. The same
// four firings with --every 10m run it once (the case above, at 1 s).
DBLOCK_TEST_SERVERS("cli exec control: a slot by the hosts' clocks runs a slot several times",
                    "[cli][runs][control]") {
  dblock::test::temp_dir dir("exec-every-control");
  const std::string cmd = "s=$(( $(date +%s) / 600 )); if mkdir " + dir.file("done.") +
                          "$s 2>/dev/null; then echo $s >> " + dir.file("runs") + "; fi";
  const std::string bad =
      fire_skewed(ctx, {"--lock", lock_name(), "--wait", "60s", "-c", cmd}, nullptr);
  INFO(bad);
  CHECK(bad.empty());
  const auto v = lines_of(dir.file("runs"));
  INFO(v.size() << " runs of one real moment, in host slots " << distinct(v));
  CHECK(v.size() >= 2);  // what the database clock's slot prevents
}
