// The in-memory backend for users' unit tests (`sqlite::memory:`, docs/testing.md): the real
// SQLite engine on one private database shared by every connection of one dblock::database, with
// no file anywhere. Every kind runs on it; two threads contend exactly as on a file; two handles
// never see each other's database; no file is created; 100 acquire/release cycles are quick.
// (That the handle keeps the database open while it lives is not tested: closing a pooled SQLite
// connection under dblock's cached statements fails with SQLITE_BUSY and leaks it.)
// (Tagged [unit]: they need no server, and run in the unit entry.)
#include <soci/soci.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dblock/dblock.hpp"
#include "harness.hpp"

using namespace dblock::test;

namespace {

dblock::database memory(int pool_size = 4) {
  dblock::database_options o;
  o.pool_size = pool_size;
  return dblock::database("sqlite::memory:", o);
}

// The files under `dir` (recursively).
std::set<std::string> files_under(const std::filesystem::path& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(
           dir, std::filesystem::directory_options::skip_permission_denied, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    out.insert(it->path().string());
  return out;
}

}  // namespace

TEST_CASE("sqlite::memory: one private database per handle, migrated, and no file",
          "[unit][memory]") {
  // Run in an empty working directory, so that a file made relative to it would show.
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dblock-memory-test-" + dblock::test::random_suffix());
  std::filesystem::create_directory(dir);
  const auto tmp_before = files_under(std::filesystem::temp_directory_path());
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir);
  {
    dblock::database db = memory();
    CHECK(db.backend() == "sqlite");
    // Migrated when made: a lease works at once. Held through one pooled connection, it is seen
    // held through another (a second lease_lock on a second thread borrows its own).
    dblock::lease_lock a(db, "job");
    auto g = a.try_acquire();
    REQUIRE(g);
    auto c1 = db.connect();  // keeps one connection busy: the next calls use others
    std::optional<bool> seen_free;
    std::thread([&] {
      dblock::lease_lock b(db, "job");
      seen_free = b.try_acquire().has_value();
    }).join();
    CHECK(seen_free == false);
    // Another handle is another database (negative control of the sharing above).
    dblock::database other = memory();
    dblock::lease_lock c(other, "job");
    CHECK(c.try_acquire());
  }
  std::filesystem::current_path(cwd);
  CHECK(files_under(dir).empty());
  std::filesystem::remove_all(dir);
  std::set<std::string> made;
  for (const auto& f : files_under(std::filesystem::temp_directory_path()))
    if (!tmp_before.count(f) && f.find("dblock-memory") != std::string::npos) made.insert(f);
  CHECK(made.empty());
}

TEST_CASE("sqlite::memory: SQLite's own in-memory forms are refused", "[unit][memory]") {
  // SQLite's own in-memory names would give each pooled connection a database of its own.
  for (const char* url :
       {"sqlite:///:memory:", "sqlite://:memory:", "sqlite:///tmp/x.db?mode=:memory:"}) {
    INFO(url);
    try {
      dblock::database bad(url);
      FAIL("accepted");
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find("sqlite::memory:") != std::string::npos);
    }
  }
  CHECK(code_of([] { dblock::database bad("sqlite://file:x?mode=memory"); }) ==
        errc::invalid_argument);
}

TEST_CASE("sqlite::memory: two threads contend for a lease as two processes would",
          "[unit][memory]") {
  dblock::database db = memory();
  {
    auto c = db.connect();
    c.session() << "CREATE TABLE counter (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)";
    c.session() << "INSERT INTO counter VALUES (1, 0)";
  }
  std::mutex mu;
  std::vector<std::int64_t> fences;
  auto worker = [&] {
    dblock::lease_lock lock(db, "counter");
    for (int i = 0; i < 50; ++i) {
      auto g = lock.acquire(std::chrono::seconds(10));
      g.fenced([](soci::session& sql) {
        int n = 0;
        sql << "SELECT n FROM counter WHERE id = 1", soci::into(n);
        const int next = n + 1;  // soci::use binds a reference: never a temporary
        sql << "UPDATE counter SET n = :n WHERE id = 1", soci::use(next);
      });
      std::lock_guard<std::mutex> lk(mu);
      fences.push_back(g.fence());
    }
  };
  std::thread t1(worker), t2(worker);
  t1.join();
  t2.join();
  int n = 0;
  db.connect().session() << "SELECT n FROM counter WHERE id = 1", soci::into(n);
  CHECK(n == 100);
  REQUIRE(fences.size() == 100);
  CHECK(std::set<std::int64_t>(fences.begin(), fences.end()).size() == 100);  // one per grant
}

TEST_CASE("sqlite::memory: every kind works", "[unit][memory]") {
  dblock::database db = memory();
  // Semaphore: 2 permits.
  dblock::semaphore s1(db, "sem", 2), s2(db, "sem", 2), s3(db, "sem", 2);
  auto p1 = s1.try_acquire();
  auto p2 = s2.try_acquire();
  CHECK(p1);
  CHECK(p2);
  CHECK_FALSE(s3.try_acquire());
  // Read-write lock.
  dblock::rwlock r1(db, "rw"), r2(db, "rw"), w(db, "rw");
  auto rg1 = r1.try_acquire_shared();
  auto rg2 = r2.try_acquire_shared();
  CHECK(rg1);
  CHECK(rg2);
  CHECK_FALSE(w.try_acquire());
  // Lock set.
  dblock::lock_set set(db, std::vector<std::string>{"x", "y"});
  auto sg = set.try_acquire();
  REQUIRE(sg);
  CHECK(sg->size() == 2);
  // Election.
  dblock::election e(db, "leader", "node-1");
  auto lead = win_observed(db, e, "node-1");
  // A waiter woken by a release in the same process (no polling needed).
  dblock::lease_lock holder(db, "wait"), waiter(db, "wait");
  auto h = holder.try_acquire();
  REQUIRE(h);
  std::thread releaser = run_after(milliseconds(100), [&] { h->release(); });
  auto got = waiter.acquire(std::chrono::seconds(10));
  releaser.join();
  CHECK(got.valid());
  // Row locks in a transaction.
  dblock::transaction t(db);
  CHECK(t.lock_resource("row", dblock::lock_wait::nowait));
  t.commit();
  // Segmented stock and the ID generator.
  dblock::segmented_stock stock(db, "stock");
  stock.create(10, 2);
  CHECK(stock.take(3));
  dblock::id_generator ids(db, "ids");
  const auto a = ids.next();
  const auto b = ids.next();
  CHECK(a > 0);
  CHECK(b != a);
}

// Speed is a figure, not a check (a bound in ms measures the machine: under ASan and two busy
// cores it is several times the idle one): the cycles must each be granted and released, and
// the time is reported.
TEST_CASE("sqlite::memory: 100 acquire/release cycles, each granted at once", "[unit][memory]") {
  dblock::database db = memory();
  dblock::lease_lock lock(db, "fast");
  (void)lock.try_acquire();  // the first statements are prepared here
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100; ++i) {
    auto g = lock.try_acquire();
    REQUIRE(g);
    g->release();
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  WARN("100 acquire/release cycles on sqlite::memory: " << ms << " ms");
}
