#include "harness.hpp"

#include <fcntl.h>
#include <signal.h>
#include <soci/soci.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

extern char** environ;

namespace dblock::test {
namespace {

std::map<std::string, worker_fn>& workers() {
  static std::map<std::string, worker_fn> w;
  return w;
}

bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci && (std::string(ci) == "true" || std::string(ci) == "1");
}

}  // namespace

std::string random_suffix(std::size_t n) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* chars = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::uniform_int_distribution<int> d(0, 35);
  std::string s;
  for (std::size_t i = 0; i < n; ++i)
    s += chars[d(rng)];
  return s;
}

std::string backend_env(const std::string& backend) {
  if (backend == "postgresql") return "DBLOCK_TEST_POSTGRESQL_URL";
  if (backend == "mysql") return "DBLOCK_TEST_MYSQL_URL";
  return "DBLOCK_TEST_SQLITE_DIR";
}

std::optional<std::string> backend_url(const std::string& backend) {
  if (backend == "sqlite") {
    const char* dir = std::getenv("DBLOCK_TEST_SQLITE_DIR");
    std::string d = dir && *dir ? dir : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
    return "sqlite://" + std::string(d[0] == '/' ? "" : "/") + d + "/dblock-test-" +
           random_suffix(12) + ".db";
  }
  const char* url = std::getenv(backend_env(backend).c_str());
  if (!url || !*url) return std::nullopt;
  return std::string(url);
}

database_options context::options() const {
  database_options o;
  o.table_prefix = prefix;
  o.pool_size = 8;
  return o;
}

database context::open() const {
  return database(url, options());
}

database context::open(database_options o) const {
  return database(url, o);
}

std::string context::new_prefix() {
  prefixes.push_back("u" + random_suffix(8) + "_");
  return prefixes.back();
}

void context::exec(const std::string& sql) const {
  auto c = db.connect();
  c.session() << sql;
}

void run_on(const std::string& backend, const std::function<void(context&)>& body) {
  auto url = backend_url(backend);
  if (!url) {
    std::string msg = "BACKEND NOT CONFIGURED: " + backend + " (set " + backend_env(backend) +
                      ", or run scripts/test.sh which starts throwaway servers)";
    if (in_ci()) FAIL(msg + " -- a missing backend fails the run under CI=true");
    WARN("**************** " << msg << " ****************");
    SUCCEED("skipped");
    skipped_test() = true;
    return;
  }
  context ctx{backend, *url, "t" + random_suffix(8) + "_", database(*url)};
  ctx.prefixes.push_back(ctx.prefix);
  ctx.db = database(*url, ctx.options());
  dblock::migrate(ctx.db);
  struct cleanup {
    context& c;
    ~cleanup() {
      if (c.backend == "sqlite") {
        std::string path = c.url.substr(std::string("sqlite://").size());
        for (const char* ext : {"", "-wal", "-shm"})
          ::unlink((path + ext).c_str());
        // The wake-up doorbell beside the file (docs/waiting.md): empty but for entries that
        // were removed as soon as they were made.
        ::rmdir((path + ".dblock-wake").c_str());
        return;
      }
      // Best effort: servers from scripts/test-servers.sh are thrown away anyway, but users may
      // point the suite at their own.
      try {
        auto conn = c.db.connect();
        for (const auto& p : c.prefixes)
          for (const char* t :
               {"resource_lock", "resource_lock_fence_floor", "dblock_schema_migrations",
                "resource_lock_audit", "stock_segment", "id_block", "lock_waiter", "semaphore",
                "leader", "counter", "items", "session_holder"})
            conn.session() << "DROP TABLE IF EXISTS " << p << t;
        if (c.backend == "postgresql")
          for (const auto& p : c.prefixes)
            for (const char* f :
                 {"dblock_wake()", "dblock_check_args(text, text, bigint, bigint, boolean)",
                  "dblock_check_durable()", "dblock_acquire(text, text, bigint)",
                  "dblock_renew(text, text, bigint, bigint)",
                  "dblock_release(text, text, bigint, boolean)", "dblock_check_fence(text, bigint)",
                  "dblock_session_marker(text, text)"})
              conn.session() << "DROP FUNCTION IF EXISTS " << p << f;
        if (c.backend == "mysql")  // the SQL API's procedures (migration 0012)
          for (const auto& p : c.prefixes)
            for (const char* f :
                 {"dblock_acquire", "dblock_renew", "dblock_release", "dblock_check_fence"})
              conn.session() << "DROP PROCEDURE IF EXISTS " << p << f;
        if (c.backend == "mysql")  // the session leases' marker read (migration 0017)
          for (const auto& p : c.prefixes)
            conn.session() << "DROP FUNCTION IF EXISTS " << p << "dblock_session_marker";
      } catch (...) {
      }
    }
  } clean{ctx};
  try {
    body(ctx);
  } catch (const test_skipped&) {
    // skip_test() marked it skipped and said why.
  }
}

bool& skipped_test() {
  static bool flag = false;
  return flag;
}

void skip(const std::string& why) {
  if (in_ci()) FAIL("SKIPPED: " << why << " -- a skipped test fails the run under CI=true");
  WARN("**************** SKIPPED: " << why << " ****************");
  skipped_test() = true;
}

void skip_test(const std::string& why) {
  skip(why);
  throw test_skipped{};
}

worker_registration::worker_registration(const char* name, worker_fn fn) {
  workers()[name] = fn;
}

int run_worker(const std::string& name, const std::vector<std::string>& args) {
  auto it = workers().find(name);
  if (it == workers().end()) {
    std::cerr << "unknown worker '" << name << "'\n";
    return 2;
  }
  try {
    return it->second(args);
  } catch (const std::exception& e) {
    std::cerr << "worker " << name << ": " << e.what() << "\n";
    return 3;
  }
}

int most_at_once(const std::vector<std::pair<long long, long long>>& intervals) {
  std::vector<std::pair<long long, int>> ev;
  for (const auto& [enter, exit] : intervals) {
    ev.emplace_back(enter, 1);
    ev.emplace_back(exit, -1);
  }
  std::sort(ev.begin(), ev.end());
  int open = 0, most = 0;
  for (const auto& e : ev)
    most = std::max(most, open += e.second);
  return most;
}

void redirect_child_stdio(int out, int err) {
  ::dup2(out, 1);
  ::dup2(err, 2);
  int devnull = ::open("/dev/null", O_RDONLY);
  if (devnull >= 0) ::dup2(devnull, 0);
}

int spawn_worker(const std::string& name, const std::vector<std::string>& args,
                 const std::vector<std::string>& extra_env) {
  exec_argv argv({"/proc/self/exe", "--worker", name}, args);
  // Inherited variables that extra_env sets again are dropped: getenv() returns the first match.
  auto key_of = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    bool overridden = std::any_of(extra_env.begin(), extra_env.end(),
                                  [&](const std::string& x) { return key_of(x) == key_of(kv); });
    if (!overridden) env_s.push_back(kv);
  }
  env_s.insert(env_s.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> envp;
  for (auto& e : env_s)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), envp.data());
  if (rc != 0) throw std::runtime_error("posix_spawn failed: " + std::to_string(rc));
  return pid;
}

int wait_worker(int pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

long long median_round_trip_us(const database& db, int n) {
  std::vector<long long> us;
  for (int i = 0; i < n; ++i) {
    const long long t0 = monotonic_ns();
    db.ping();
    us.push_back((monotonic_ns() - t0) / 1000);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

long long monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

void sleep_until_monotonic(long long t_ns) {
  long long now = monotonic_ns();
  if (t_ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(t_ns - now));
}

// ---- process_set -------------------------------------------------------------------------------

void describe_hung_process(int pid) {
  std::cerr << "process " << pid << " did not exit in time; its threads:" << std::endl;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(task, ec)) {
    std::ifstream w(t.path() / "wchan");
    std::string wchan;
    std::getline(w, wchan);
    std::cerr << "  thread " << t.path().filename().string() << " wchan=" << wchan << std::endl;
  }
  if (std::system("command -v gdb >/dev/null 2>&1") != 0) return;
  const std::string cmd = "gdb -p " + std::to_string(pid) +
                          " -batch -nx -ex 'thread apply all bt 25' 2>/dev/null | grep -E "
                          "'^(Thread|#)' | head -200 1>&2";
  if (std::system(cmd.c_str()) != 0) std::cerr << "  (gdb could not attach)" << std::endl;
  // A process stuck waiting for a child of its own (the command of `dblock exec`) shows where
  // that one is stuck too.
  for (const auto& t : std::filesystem::directory_iterator(task, ec)) {
    std::ifstream children(t.path() / "children");
    for (int child = 0; children >> child;)
      describe_hung_process(child);
  }
}

namespace {

// Kills a worker with SIGKILL and reaps it.
void kill_and_reap(int pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

process_set::~process_set() {
  for (int pid : pids_)
    kill_and_reap(pid);
}

int process_set::spawn(const std::string& name, const std::vector<std::string>& args,
                       const std::vector<std::string>& env) {
  int pid = spawn_worker(name, args, env);
  pids_.push_back(pid);
  return pid;
}

int process_set::wait(int pid, std::chrono::milliseconds timeout) {
  long long deadline = monotonic_ns() + timeout.count() * ns_per_ms;
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) return -2;
    if (monotonic_ns() > deadline) {
      describe_hung_process(pid);
      kill_and_reap(pid);
      forget(pid);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  forget(pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<int> process_set::wait_all(std::chrono::milliseconds timeout) {
  long long deadline = monotonic_ns() + timeout.count() * ns_per_ms;
  std::vector<int> all = pids_, out;
  for (int pid : all) {
    long long left = std::max(0LL, (deadline - monotonic_ns()) / ns_per_ms);
    out.push_back(wait(pid, std::chrono::milliseconds(left)));
  }
  return out;
}

std::vector<int> process_set::wait_all() {
  std::vector<int> out;
  for (int pid : pids_)
    out.push_back(wait_worker(pid));
  pids_.clear();
  return out;
}

void process_set::forget(int pid) {
  pids_.erase(std::remove(pids_.begin(), pids_.end(), pid), pids_.end());
}

// ---- files and databases of worker processes ---------------------------------------------------

temp_dir::temp_dir(const std::string& tag) {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/dblock-" + tag + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path = buf.data();
}

bool keep_temp_dirs() {
  const char* v = std::getenv("DBLOCK_TEST_KEEP_DIRS");
  return v && *v && std::string(v) != "0";
}

temp_dir::~temp_dir() {
  if (keep_temp_dirs()) return;
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

std::string faketime_lib() {
  const char* p = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
  return ::access(p, R_OK) == 0 ? p : "";
}

void write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename " + tmp + ": " + std::strerror(errno));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void at_machine_pace(const std::function<std::vector<std::string>(int, bool)>& attempt) {
  for (int scale = 1; scale <= 4; scale *= 2) {
    std::vector<std::string> misses;
    try {
      misses = attempt(scale, scale == 4);
    } catch (const dblock::error& e) {
      // A call bounded by the scenario's TTL (a try_acquire's deadline is the TTL less its
      // margin) that ran out of it, connecting or waiting for the server: the machine's pace too
      // (seen: a MariaDB connection that took over 1,350 ms beside two CPU hogs). The last
      // attempt lets it through.
      if (scale == 4 || (e.code() != errc::timeout && e.code() != errc::connection_failed)) throw;
      misses.push_back(std::string("a call ran out of its deadline: ") + e.what());
    }
    if (misses.empty() || scale == 4) return;
    std::ostringstream m;
    m << "missed at the pace of this machine at scale " << scale << "; again at " << scale * 2
      << ":";
    for (const auto& x : misses)
      m << "\n  " << x;
    WARN(m.str());
  }
}

bool wait_for_file(const std::string& path, std::chrono::milliseconds timeout) {
  long long deadline = monotonic_ns() + timeout.count() * ns_per_ms;
  while (::access(path.c_str(), F_OK) != 0) {
    if (monotonic_ns() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

database open_db(const std::string& url, const std::string& prefix, std::size_t pool) {
  database_options o = with_prefix(prefix);
  o.pool_size = pool;
  return database(url, o);
}

table_cleanup::~table_cleanup() {
  if (ctx.backend == "sqlite") return;
  for (const auto& n : names) {
    try {
      ctx.exec("DROP TABLE IF EXISTS " + n);
    } catch (...) {
    }
  }
}

}  // namespace dblock::test
