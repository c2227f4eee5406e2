// SQLite's doorbell rings the head's handle alone (docs/waiting.md, "Wake-ups"): each handle with
// waiters watches a directory of its own, `<database file>.dblock-wake/h.<bell>`, whose name its
// queue entries carry, and a release creates its ring entry there. With one directory for every
// handle, each release woke a thread in every process that waited on the file.
#include <poll.h>
#include <soci/soci.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "waiting_support.hpp"

using namespace dblock::test;

namespace {

// The entries created in a few directories (inotify IN_CREATE) while it lives.
class entry_watch {
 public:
  entry_watch() : fd_(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) {}
  ~entry_watch() { ::close(fd_); }
  entry_watch(const entry_watch&) = delete;
  entry_watch& operator=(const entry_watch&) = delete;
  bool add(const std::string& dir) {
    const int wd = ::inotify_add_watch(fd_, dir.c_str(), IN_CREATE);
    if (wd < 0) return false;
    dirs_[wd] = dir;
    return true;
  }
  // Reads what arrived within `wait`: directory -> the names created in it.
  std::map<std::string, std::vector<std::string>> created(milliseconds wait) {
    std::map<std::string, std::vector<std::string>> out;
    const auto end = std::chrono::steady_clock::now() + wait;
    alignas(inotify_event) char buf[8192];
    while (std::chrono::steady_clock::now() < end) {
      pollfd p{fd_, POLLIN, 0};
      ::poll(&p, 1, 20);
      for (;;) {
        const ssize_t n = ::read(fd_, buf, sizeof buf);
        if (n <= 0) break;
        for (ssize_t i = 0; i < n;) {
          const auto* ev = reinterpret_cast<const inotify_event*>(buf + i);
          if (ev->len > 0) out[dirs_[ev->wd]].push_back(ev->name);
          i += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        }
      }
    }
    return out;
  }

 private:
  int fd_;
  std::map<int, std::string> dirs_;
};

// One waiting acquire on a thread of its own, on a handle of its own; it holds the lease until
// `release` is set.
struct handle_waiter {
  std::thread t;
  std::atomic<bool> got{false}, release{false};
  std::string error;
  void start(dblock::database db, const std::string& name) {
    t = std::thread([this, db, name] {
      try {
        dblock::lease_options lo;
        lo.poll_max = std::chrono::seconds(20);  // only a ring wakes it within the test's bounds
        dblock::lease_lock lk(db, name, lo);
        auto g = lk.acquire(milliseconds(30000));
        got = true;
        while (!release.load())
          std::this_thread::sleep_for(milliseconds(5));
        g.release();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  }
  bool wait_got(milliseconds within) const {
    const auto end = std::chrono::steady_clock::now() + within;
    while (!got.load() && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(milliseconds(2));
    return got.load();
  }
  ~handle_waiter() {
    release = true;
    if (t.joinable()) t.join();
  }
};

std::vector<std::string> bells_in_queue_order(const dblock::test::context& ctx,
                                              const std::string& name) {
  auto c = ctx.db.connect();
  soci::rowset<std::string> rs =
      (c.session().prepare << "SELECT bell FROM " << ctx.table("lock_waiter")
                           << " WHERE resource_name = :n ORDER BY ticket",
       soci::use(name));
  return std::vector<std::string>(rs.begin(), rs.end());
}

// The names in `names` that are ring entries ("<16 hex>.<fence>.<head>"), not handle directories.
int rings_in(const std::vector<std::string>& names) {
  int n = 0;
  for (const auto& x : names)
    if (x.rfind("h.", 0) != 0) ++n;
  return n;
}

}  // namespace

DBLOCK_TEST_ONLY("sqlite",
                 "the doorbell rings the head's handle alone, in its own directory; the other "
                 "waiting handle and the shared directory see no ring",
                 "[waiting][doorbell]") {
  namespace fs = std::filesystem;
  const std::string name = "doorbell-" + dblock::test::random_suffix();
  const std::string bell_dir = ctx.url.substr(std::string("sqlite://").size()) + ".dblock-wake";
  dblock::lease_lock holder_lock(ctx.db, name);
  auto held = holder_lock.try_acquire();
  REQUIRE(held);
  auto b = std::make_unique<handle_waiter>();
  auto c = std::make_unique<handle_waiter>();
  b->start(ctx.open(), name);
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  c->start(ctx.open(), name);  // behind b in the queue
  REQUIRE(wait_for_waiters(ctx, name, 2, milliseconds(10000)));
  const auto bells = bells_in_queue_order(ctx, name);
  REQUIRE(bells.size() == 2);
  INFO("bells " << bells[0] << ", " << bells[1]);
  CHECK(bells[0].size() == 16);
  CHECK(bells[1].size() == 16);
  CHECK(bells[0] != bells[1]);
  const std::string dir_b = bell_dir + "/h." + bells[0], dir_c = bell_dir + "/h." + bells[1];
  REQUIRE(fs::is_directory(dir_b));
  REQUIRE(fs::is_directory(dir_c));
  std::this_thread::sleep_for(milliseconds(300));  // both watched and asleep

  const long long bound = scaled_bound_ms(ctx.db, 2000);
  entry_watch w;
  REQUIRE(w.add(bell_dir));
  REQUIRE(w.add(dir_b));
  REQUIRE(w.add(dir_c));
  const long long released = monotonic_ns();
  held->release();
  const bool b_got = b->wait_got(milliseconds(bound));
  INFO("b waited " << (monotonic_ns() - released) / ns_per_ms << " ms; bound " << bound << " ms");
  CHECK(b_got);  // rung: its poll is 20 s away
  CHECK_FALSE(c->got.load());
  auto seen = w.created(milliseconds(200));
  CHECK(rings_in(seen[dir_b]) == 1);
  CHECK(rings_in(seen[dir_c]) == 0);
  CHECK(rings_in(seen[bell_dir]) == 0);

  const long long b_released = monotonic_ns();
  b->release = true;  // b's release rings c, in c's directory
  const bool c_got = c->wait_got(milliseconds(bound));
  INFO("c waited " << (monotonic_ns() - b_released) / ns_per_ms << " ms");
  CHECK(c_got);
  seen = w.created(milliseconds(200));
  CHECK(rings_in(seen[dir_c]) == 1);
  CHECK(rings_in(seen[dir_b]) == 0);
  CHECK(rings_in(seen[bell_dir]) == 0);
  CHECK(b->error.empty());
  CHECK(c->error.empty());

  // A handle that closes removes its directory.
  b.reset();
  c.reset();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((fs::exists(dir_b) || fs::exists(dir_c)) && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(milliseconds(20));
  CHECK_FALSE(fs::exists(dir_b));
  CHECK_FALSE(fs::exists(dir_c));
}
