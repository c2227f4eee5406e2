// Read-write locks (include/dblock/rwlock.hpp) on every backend: readers share, a writer
// excludes everyone, a waiting writer holds back new readers, waits time out and are cancelled,
// and processes of readers and writers: no writer overlaps anyone, readers really overlap, a
// writer gets in within a bounded time under continuous readers, writer fences grow, with a
// negative control of writers that do not wait for the readers already in.
#include <soci/soci.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "internals.hpp"

using dblock::errc;
using dblock::lease_guard;
using dblock::rwlock;
using dblock::test::code_of;
using dblock::test::full_run;
using dblock::test::monotonic_ns;
using dblock::test::open_db;
using dblock::test::process_set;
using dblock::test::read_file;
using dblock::test::sleep_until_monotonic;
using dblock::test::temp_dir;
using dblock::test::write_file_atomic;
using std::chrono::milliseconds;

namespace {

constexpr long long ns_per_ms = 1000000LL;

std::string rw_name(const std::string& stem) {
  return stem + "/" + dblock::test::random_suffix();
}

// True while the writer row of `name` is held (a writer holds or waits).
bool writer_row_held(const dblock::test::context& ctx, const std::string& name) {
  auto row = dblock::test::read_lease(ctx.db.connect(), name);
  return row && row->hold_count > 0 && row->expires_at_us > row->now_us;
}

}  // namespace

DBLOCK_TEST("rwlock: readers share, a writer excludes readers and writers, fences grow",
            "[rwlock]") {
  const std::string name = rw_name("cache");
  rwlock a(ctx.db, name), b(ctx.db, name), w(ctx.db, name), w2(ctx.db, name);
  auto r1 = a.try_lock_shared();
  auto r2 = b.try_lock_shared();
  REQUIRE(r1);
  REQUIRE(r2);  // two readers at once
  CHECK(r1->name() != r2->name());
  CHECK(rwlock::reader_of(r1->name())->first == name);
  CHECK_FALSE(w.try_lock());                // readers in: no writer
  CHECK_FALSE(writer_row_held(ctx, name));  // and the writer row was given back
  r1->release();
  r2->release();
  auto wg = w.try_lock();
  REQUIRE(wg);
  CHECK(wg->name() == name);  // the writer's lease is the row of the name itself
  const std::int64_t first = wg->fence();
  CHECK_FALSE(a.try_lock_shared());  // a writer in: no reader
  CHECK_FALSE(w2.try_lock());        // nor another writer
  wg->release();
  auto wg2 = w2.try_lock();
  REQUIRE(wg2);
  CHECK(wg2->fence() > first);  // every write acquisition a new fence
  wg2->release();
  CHECK(a.try_lock_shared());
}

DBLOCK_TEST("rwlock: a waiting writer holds back new readers and gets in when readers leave",
            "[rwlock]") {
  const std::string name = rw_name("prefer");
  rwlock reader(ctx.db, name), late(ctx.db, name), writer(ctx.db, name);
  auto r = reader.try_lock_shared();
  REQUIRE(r);
  std::optional<lease_guard> wg;
  long long got_ns = 0;
  std::thread t([&] {
    wg.emplace(writer.lock(std::chrono::seconds(20)));
    got_ns = monotonic_ns();
  });
  const long long until = monotonic_ns() + 10000 * ns_per_ms;
  while (!writer_row_held(ctx, name) && monotonic_ns() < until)
    std::this_thread::sleep_for(milliseconds(5));
  REQUIRE(writer_row_held(ctx, name));  // the writer waits, holding its row
  CHECK_FALSE(late.try_lock_shared());  // a new reader is held back
  std::this_thread::sleep_for(milliseconds(200));
  CHECK(got_ns == 0);  // the writer still waits for the reader already in
  const long long released = monotonic_ns();
  r->release();
  t.join();
  REQUIRE(wg);
  CHECK(got_ns >= released);
  CHECK((got_ns - released) / ns_per_ms < 3000);
  CHECK_FALSE(late.try_lock_shared());
  wg->release();
  CHECK(late.try_lock_shared());
}

DBLOCK_TEST("rwlock: waits time out and are cancelled; a timed-out writer keeps nothing",
            "[rwlock]") {
  const std::string name = rw_name("wait");
  rwlock reader(ctx.db, name), writer(ctx.db, name), other(ctx.db, name);
  auto r = reader.try_lock_shared();
  REQUIRE(r);
  const long long t0 = monotonic_ns();
  try {
    (void)writer.lock(milliseconds(300));
    FAIL("a writer got in beside a reader");
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK(std::string(e.what()).find("1 reader(s) still in") != std::string::npos);
  }
  CHECK((monotonic_ns() - t0) / ns_per_ms >= 290);
  CHECK_FALSE(writer_row_held(ctx, name));  // given back
  CHECK(other.try_lock_shared());           // readers are admitted again
  dblock::cancellation cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(milliseconds(200));
    cancel.cancel();
  });
  CHECK(code_of([&] { (void)writer.lock(std::chrono::seconds(20), cancel); }) == errc::cancelled);
  canceller.join();
  r->release();
  auto wg = writer.try_lock();
  REQUIRE(wg);
  CHECK(code_of([&] { (void)reader.lock_shared(milliseconds(200)); }) == errc::timeout);
  dblock::cancellation c2;
  c2.cancel();
  CHECK(code_of([&] { (void)reader.lock_shared(std::chrono::seconds(20), c2); }) ==
        errc::cancelled);
}

DBLOCK_TEST("rwlock: bad names are refused clearly", "[rwlock]") {
  auto bad = [&](const std::string& name) { return code_of([&] { rwlock l(ctx.db, name); }); };
  CHECK(bad("") == errc::invalid_argument);
  CHECK(bad(std::string(256, 'n')) == errc::invalid_argument);
  // Over 245 bytes: a writer-only lock (no room for reader rows), like any lock name.
  rwlock writer_only(ctx.db, std::string(255, 'w'));
  CHECK(code_of([&] { (void)writer_only.try_lock_shared(); }) == errc::invalid_argument);
  CHECK(writer_only.try_lock());
  CHECK(bad("a\xEF\xBF\xBF"
            "R") == errc::invalid_argument);
  CHECK(bad(std::string("a\0b", 3)) == errc::invalid_argument);
  CHECK(code_of([&] { (void)rwlock::reader_lease_name("x", dblock::max_rwlock_readers); }) ==
        errc::invalid_argument);
  const std::string longest(245, 'L');
  rwlock l(ctx.db, longest);
  auto g = l.try_lock_shared();
  REQUIRE(g);
  CHECK(rwlock::reader_of(g->name())->first == longest);
  g->release();
  CHECK(l.try_lock());
}

// ---- processes ---------------------------------------------------------------------------------

// args: url prefix name role(reader|writer|plain-writer) iterations start_ns counter_table out
// A reader holds 10..30 ms; a writer waits (recording how long), holds 2 ms and makes a fenced
// increment. "plain-writer" (negative control) takes the name with a plain lease_lock, which
// does not wait for readers already in. Log: "R|W fence enter exit wait_ms".
DBLOCK_WORKER(rwlock_worker) {
  const std::string name = args.at(2), role = args.at(3), table = args.at(6);
  const int iterations = std::stoi(args.at(4));
  auto db = open_db(args.at(0), args.at(1), 3);
  db.ping();
  dblock::lease_options lo;
  lo.ttl = std::chrono::seconds(10);
  lo.poll_initial = milliseconds(1);
  lo.poll_max = milliseconds(10);
  rwlock l(db, name, lo);
  dblock::lease_lock plain(db, name, lo);
  std::ostringstream out;
  sleep_until_monotonic(std::stoll(args.at(5)));
  for (int i = 0; i < iterations; ++i) {
    const long long asked = monotonic_ns();
    if (role == "reader") {
      auto g = l.lock_shared(std::chrono::seconds(60));
      const long long enter = monotonic_ns();
      std::this_thread::sleep_for(milliseconds(10 + (i * 7) % 21));
      const long long exit = monotonic_ns();
      g.release();
      out << "R " << g.fence() << " " << enter << " " << exit << " " << (enter - asked) / ns_per_ms
          << "\n";
      continue;
    }
    auto g = role == "writer" ? l.lock(std::chrono::seconds(60))
                              : plain.acquire(std::chrono::seconds(60));
    const long long enter = monotonic_ns();
    std::this_thread::sleep_for(milliseconds(2));
    g.fenced(
        [&](soci::session& sql) { sql << "UPDATE " << table << " SET n = n + 1 WHERE id = 1"; });
    const long long exit = monotonic_ns();
    out << "W " << g.fence() << " " << enter << " " << exit << " " << (enter - asked) / ns_per_ms
        << "\n";
    g.release();
    std::this_thread::sleep_for(milliseconds(20));
  }
  write_file_atomic(args.at(7), out.str());
  return 0;
}

namespace {

struct interval {
  char kind = 'R';
  long long fence = 0, enter = 0, exit = 0, wait_ms = 0;
};

struct rw_run {
  std::vector<interval> all;
  int counter = -1;
};

rw_run run_rw(const dblock::test::context& ctx, int readers, int writers, int reader_iterations,
              int writer_iterations, const std::string& writer_role) {
  ctx.exec("CREATE TABLE " + ctx.table("counter") + " (id INT PRIMARY KEY, n INT)");
  ctx.exec("INSERT INTO " + ctx.table("counter") + " (id, n) VALUES (1, 0)");
  const std::string name = rw_name("procs");
  temp_dir dir("rwlock");
  process_set ps;
  const long long start_ns = monotonic_ns() + 800 * ns_per_ms;
  for (int i = 0; i < readers + writers; ++i) {
    const bool reader = i < readers;
    ps.spawn("rwlock_worker", {ctx.url, ctx.prefix, name, reader ? "reader" : writer_role,
                               std::to_string(reader ? reader_iterations : writer_iterations),
                               std::to_string(start_ns), ctx.table("counter"),
                               dir.file("w" + std::to_string(i) + ".log")});
  }
  const auto st = ps.wait_all(std::chrono::seconds(240));
  for (std::size_t i = 0; i < st.size(); ++i) {
    INFO("rwlock worker " << i << " exit status " << st[i]);
    REQUIRE(st[i] == 0);
  }
  rw_run r;
  for (int i = 0; i < readers + writers; ++i) {
    std::istringstream in(read_file(dir.file("w" + std::to_string(i) + ".log")));
    interval v;
    while (in >> v.kind >> v.fence >> v.enter >> v.exit >> v.wait_ms)
      r.all.push_back(v);
  }
  auto c = ctx.db.connect();
  c.session() << "SELECT n FROM " << ctx.table("counter") << " WHERE id = 1", soci::into(r.counter);
  return r;
}

// Writer intervals that overlap any other interval.
int writer_overlaps(const std::vector<interval>& all) {
  int n = 0;
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = 0; j < all.size(); ++j)
      if (i != j && all[i].kind == 'W' && all[i].enter < all[j].exit && all[j].enter < all[i].exit)
        ++n;
  return n;
}

int max_readers_at_once(const std::vector<interval>& all) {
  std::vector<std::pair<long long, int>> ev;
  for (const auto& v : all)
    if (v.kind == 'R') {
      ev.emplace_back(v.enter, 1);
      ev.emplace_back(v.exit, -1);
    }
  std::sort(ev.begin(), ev.end());
  int open = 0, most = 0;
  for (const auto& e : ev)
    most = std::max(most, open += e.second);
  return most;
}

}  // namespace

DBLOCK_TEST(
    "rwlock: processes of readers and writers: writers alone, readers together, "
    "writers not starved",
    "[rwlock][processes]") {
  const int reader_iterations = full_run() ? 200 : 60, writer_iterations = full_run() ? 20 : 6;
  auto r = run_rw(ctx, 4, 2, reader_iterations, writer_iterations, "writer");
  std::vector<interval> writes;
  long long longest_writer_wait = 0;
  for (const auto& v : r.all)
    if (v.kind == 'W') {
      writes.push_back(v);
      longest_writer_wait = std::max(longest_writer_wait, v.wait_ms);
    }
  std::sort(writes.begin(), writes.end(),
            [](const interval& a, const interval& b) { return a.enter < b.enter; });
  WARN(ctx.backend << ": longest writer wait " << longest_writer_wait
                   << " ms under 4 continuous readers (readers hold 10..30 ms), "
                   << max_readers_at_once(r.all) << " readers at once at most");
  CHECK(writer_overlaps(r.all) == 0);
  CHECK(max_readers_at_once(r.all) >= 2);  // readers really share
  CHECK(r.counter == 2 * writer_iterations);
  CHECK(writes.size() == static_cast<std::size_t>(2 * writer_iterations));
  for (std::size_t i = 1; i < writes.size(); ++i)
    CHECK(writes[i].fence > writes[i - 1].fence);
  // Bounded: a waiting writer holds back new readers, so it waits for the readers already in
  // (at most 30 ms each) and the other writer, not for the stream of readers.
  CHECK(longest_writer_wait < 5000);
}

DBLOCK_TEST("negative control: writers that do not wait for readers already in are caught",
            "[rwlock][processes]") {
  auto r = run_rw(ctx, 4, 2, 60, 6, "plain-writer");
  INFO("overlaps of plain writers with readers");
  CHECK(writer_overlaps(r.all) > 0);
}
