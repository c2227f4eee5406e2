// Lease durability (admin.hpp): the fast lease mode (PostgreSQL: an UNLOGGED lease table) and
// its fence epoch, and the clear refusal on the backends without it. The crash itself is in the
// fault suite (tests/faults/restart_test.cpp, "fast lease mode").
#include <soci/soci.h>
#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"
#include "waiting_support.hpp"

using dblock::lease_durability;
using dblock::lease_lock;
using namespace dblock::test;

namespace {

constexpr std::int64_t epoch_unit = std::int64_t{1} << 32;

long long fence_epoch(dblock::test::context& ctx) {
  auto c = ctx.db.connect();
  long long e = -1;
  c.session() << "SELECT epoch FROM " << ctx.prefix << "resource_lock_fence_floor WHERE id = 1",
      soci::into(e);
  return e;
}

}  // namespace

DBLOCK_TEST("lease durability: durable by default, fast mode with fences above the epoch",
            "[lease][durability][direct]") {
  const std::string name = "job/" + dblock::test::random_suffix();
  CHECK(dblock::lease_durability_of(ctx.db) == lease_durability::durable);
  dblock::set_lease_durability(ctx.db, lease_durability::durable);  // already: nothing to do
  std::int64_t last = 0;
  {
    lease_lock lock(ctx.db, name);
    auto g = lock.try_acquire();
    REQUIRE(g);
    CHECK(g->fence() == 1);  // durable tables: no epoch in the fences
    last = g->fence();
  }
  CHECK(fence_epoch(ctx) == 0);
  if (ctx.backend != "postgresql") {
    std::string message;
    try {
      dblock::set_lease_durability(ctx.db, lease_durability::fast);
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("not available on " + ctx.backend) != std::string::npos);
    CHECK(message.find(ctx.backend == "mysql" ? "innodb_flush_log_at_trx_commit"
                                              : "synchronous=normal") != std::string::npos);
    CHECK(dblock::lease_durability_of(ctx.db) == lease_durability::durable);
    return;
  }
  dblock::set_lease_durability(ctx.db, lease_durability::fast);
  CHECK(dblock::lease_durability_of(ctx.db) == lease_durability::fast);
  {
    auto c = ctx.db.connect();
    std::string p;
    c.session() << "SELECT relpersistence::text FROM pg_class WHERE relname = :t",
        soci::use(ctx.db.lock_table()), soci::into(p);
    CHECK(p == "u");
  }
  // Handles opened after the switch raise the epoch before their first acquire, once per
  // connection: every fence they grant is at least epoch x 2^32.
  std::int64_t first_epoch = 0;
  auto one_connection = ctx.options();
  one_connection.pool_size = 1;  // so that "the same connection" below is certain
  for (int h = 0; h < 3; ++h) {
    auto db = ctx.open(one_connection);
    lease_lock lock(db, name);
    auto g = lock.try_acquire();
    REQUIRE(g);
    const long long e = fence_epoch(ctx);
    INFO("handle " << h << ": fence " << g->fence() << ", epoch " << e);
    CHECK(e >= 1);
    if (h == 0) first_epoch = e;
    CHECK(e >= first_epoch + h);  // each new connection raised it
    CHECK(g->fence() > last);
    CHECK(g->fence() >= e * epoch_unit);
    CHECK(g->fence() < (e + 1) * epoch_unit);
    last = g->fence();
    // The rest of the lease works as on a durable table: reentry, renew, fenced writes, release.
    auto again = lock.try_acquire();
    REQUIRE(again);
    CHECK(again->fence() == g->fence());
    again->release();
    CHECK_NOTHROW(g->renew());
    g->fenced([&](soci::session& sql) {
      sql << "UPDATE " << ctx.db.lock_table() << " SET holder_thread = 'fenced'"
          << " WHERE resource_name = :n",
          soci::use(name);
    });
    g->release();
    // Another lock object on the same handle (same connection, no new epoch) grants the next
    // fence of the row.
    lease_lock other(db, name);
    auto g2 = other.try_acquire();
    REQUIRE(g2);
    CHECK(g2->fence() == last + 1);
    last = g2->fence();
  }
  // Back to durable: fences keep growing from the row (never back below an epoch's fences).
  dblock::set_lease_durability(ctx.db, lease_durability::durable);
  CHECK(dblock::lease_durability_of(ctx.db) == lease_durability::durable);
  auto db = ctx.open();
  lease_lock lock(db, name);
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(g->fence() == last + 1);
}

DBLOCK_TEST_ONLY("postgresql", "fast lease mode is refused behind a transaction-mode pooler",
                 "[lease][durability][direct]") {
  // The pooler's client connections outlive the server's sessions, so dblock could not tell that
  // a crash lost grants: it refuses to acquire on a fast table through one (a direct URL works).
  dblock::set_lease_durability(ctx.db, lease_durability::fast);
  auto o = ctx.options();
  o.pooler = dblock::pooler_mode::transaction;
  dblock::database pooled(ctx.url, o);
  lease_lock lock(pooled, "job/" + dblock::test::random_suffix());
  std::string message;
  try {
    (void)lock.try_acquire();
  } catch (const dblock::error& e) {
    CHECK(e.code() == errc::invalid_argument);
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("transaction-mode pooler") != std::string::npos);
  // A direct handle on the same table acquires.
  lease_lock direct(ctx.open(), lock.name());
  CHECK(direct.try_acquire());
}

// PostgreSQL: a release that frees a lease commits without waiting for the WAL flush (the next
// grant's durable commit flushes it); every other lease write waits as before, and the setting
// ends with the release's own transaction. A deferred constraint trigger on the lock table logs
// synchronous_commit as each write's transaction commits. (MySQL and SQLite have no per-
// transaction durability: every release there waits for the log as before.)
DBLOCK_TEST_ONLY("postgresql",
                 "a release that frees a lease alone skips the WAL flush wait, for its own commit",
                 "[lease][durability]") {
  const std::string log = ctx.table("commit_log"), fn = ctx.table("log_commit");
  ctx.exec("CREATE TABLE " + log +
           " (id SERIAL PRIMARY KEY, hold_count INT NOT NULL, sync TEXT NOT NULL)");
  ctx.exec("CREATE FUNCTION " + fn + "() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO " +
           log +
           " (hold_count, sync) VALUES (NEW.hold_count,"
           " current_setting('synchronous_commit')); RETURN NULL; END$$");
  ctx.exec("CREATE CONSTRAINT TRIGGER " + ctx.prefix + "log_commit AFTER INSERT OR UPDATE ON " +
           ctx.db.lock_table() + " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " +
           fn + "()");
  auto o = ctx.options();
  o.pool_size = 1;  // the check afterwards runs on the releases' own connection
  dblock::database db = ctx.open(o);
  const std::string name = "job/" + dblock::test::random_suffix();
  lease_lock lock(db, name);
  {
    auto g = lock.try_acquire();  // 1: acquire
    REQUIRE(g);
    auto inner = lock.try_acquire();  // 2: reentry
    REQUIRE(inner);
    inner->release();  // 1: a release that leaves the lease held
    g->release();      // 0: the release that frees it
  }
  auto again = lock.try_acquire();  // 1: the next grant
  REQUIRE(again);
  (void)dblock::force_release(db, name, "test", "fast_leases_test");  // 0: forced, fence + 1
  std::vector<std::pair<int, std::string>> seen;
  std::string after;
  {
    auto c = db.connect();
    soci::rowset<soci::row> rows =
        (c.session().prepare << "SELECT hold_count, sync FROM " << log << " ORDER BY id");
    for (const auto& r : rows)
      seen.emplace_back(r.get<int>(0), r.get<std::string>(1));
    c.session() << "SELECT current_setting('synchronous_commit')", soci::into(after);
  }
  std::string trace;
  for (const auto& [h, s] : seen)
    trace += " " + std::to_string(h) + ":" + s;
  INFO("commits (hold_count:synchronous_commit):" << trace);
  const std::vector<std::pair<int, std::string>> expected = {{1, "on"},  {2, "on"}, {1, "on"},
                                                             {0, "off"}, {1, "on"}, {0, "on"}};
  CHECK(seen == expected);
  CHECK(after == "on");  // the connection's own setting is back for its next transactions
}

namespace {

// A VFS over the default one that counts syncs of WAL files: how many commits waited for the
// disk. Registered as the default while a test's handle opens its connections.
std::atomic<int> wal_syncs{0};
sqlite3_vfs* base_vfs = nullptr;

struct counted_file {
  sqlite3_file base;  // first: SQLite sees this
  bool wal;
  sqlite3_file* real() { return reinterpret_cast<sqlite3_file*>(this + 1); }
};

counted_file* as_counted(sqlite3_file* f) {
  return reinterpret_cast<counted_file*>(f);
}
sqlite3_file* real(sqlite3_file* f) {
  return as_counted(f)->real();
}

int c_close(sqlite3_file* f) {
  return real(f)->pMethods->xClose(real(f));
}
int c_read(sqlite3_file* f, void* b, int n, sqlite3_int64 o) {
  return real(f)->pMethods->xRead(real(f), b, n, o);
}
int c_write(sqlite3_file* f, const void* b, int n, sqlite3_int64 o) {
  return real(f)->pMethods->xWrite(real(f), b, n, o);
}
int c_truncate(sqlite3_file* f, sqlite3_int64 n) {
  return real(f)->pMethods->xTruncate(real(f), n);
}
int c_sync(sqlite3_file* f, int flags) {
  if (as_counted(f)->wal) ++wal_syncs;
  return real(f)->pMethods->xSync(real(f), flags);
}
int c_size(sqlite3_file* f, sqlite3_int64* n) {
  return real(f)->pMethods->xFileSize(real(f), n);
}
int c_lock(sqlite3_file* f, int l) {
  return real(f)->pMethods->xLock(real(f), l);
}
int c_unlock(sqlite3_file* f, int l) {
  return real(f)->pMethods->xUnlock(real(f), l);
}
int c_check(sqlite3_file* f, int* out) {
  return real(f)->pMethods->xCheckReservedLock(real(f), out);
}
int c_control(sqlite3_file* f, int op, void* arg) {
  return real(f)->pMethods->xFileControl(real(f), op, arg);
}
int c_sector(sqlite3_file* f) {
  return real(f)->pMethods->xSectorSize(real(f));
}
int c_device(sqlite3_file* f) {
  return real(f)->pMethods->xDeviceCharacteristics(real(f));
}
int c_shm_map(sqlite3_file* f, int pg, int sz, int ext, void volatile** p) {
  return real(f)->pMethods->xShmMap(real(f), pg, sz, ext, p);
}
int c_shm_lock(sqlite3_file* f, int off, int n, int flags) {
  return real(f)->pMethods->xShmLock(real(f), off, n, flags);
}
void c_shm_barrier(sqlite3_file* f) {
  real(f)->pMethods->xShmBarrier(real(f));
}
int c_shm_unmap(sqlite3_file* f, int del) {
  return real(f)->pMethods->xShmUnmap(real(f), del);
}

const sqlite3_io_methods counted_methods = {
    2,          c_close,       c_read,      c_write,   c_truncate, c_sync,   c_size,
    c_lock,     c_unlock,      c_check,     c_control, c_sector,   c_device, c_shm_map,
    c_shm_lock, c_shm_barrier, c_shm_unmap, nullptr,   nullptr};

int c_open(sqlite3_vfs*, const char* name, sqlite3_file* f, int flags, int* out) {
  auto* cf = as_counted(f);
  cf->base.pMethods = nullptr;
  const int rc = base_vfs->xOpen(base_vfs, name, cf->real(), flags, out);
  if (rc != SQLITE_OK) return rc;
  cf->wal = (flags & SQLITE_OPEN_WAL) != 0;
  cf->base.pMethods = &counted_methods;
  return SQLITE_OK;
}

sqlite3_vfs counted_vfs() {
  base_vfs = sqlite3_vfs_find(nullptr);
  sqlite3_vfs v;
  std::memcpy(&v, base_vfs, sizeof v);
  v.zName = "dblock-test-counted";
  v.szOsFile = static_cast<int>(sizeof(counted_file)) + base_vfs->szOsFile;
  v.xOpen = c_open;
  v.pAppData = nullptr;
  return v;
}

// The counting VFS, registered as the default for a test's length.
struct counting_vfs {
  counting_vfs() { REQUIRE(sqlite3_vfs_register(&vfs(), 1) == SQLITE_OK); }
  ~counting_vfs() { sqlite3_vfs_register(base_vfs, 1), sqlite3_vfs_unregister(&vfs()); }
  static sqlite3_vfs& vfs() {
    static sqlite3_vfs v = counted_vfs();
    return v;
  }
};

}  // namespace

// SQLite: a release's commit does not sync the WAL (PRAGMA synchronous = NORMAL for it alone);
// acquires, reentrant releases and forced releases still do, and the connection is back at its
// own level afterwards. Counted by a VFS that counts syncs of WAL files.
DBLOCK_TEST_ONLY("sqlite", "a release's commit alone skips the sync of the WAL",
                 "[lease][durability]") {
  counting_vfs counting;
  auto o = ctx.options();
  o.pool_size = 1;
  dblock::database db = ctx.open(o);
  lease_lock warm(db, "warm-up");  // the handle connects and its tables exist
  warm.try_acquire()->release();
  const int cycles = 40;
  auto syncs_of = [&](const std::function<void()>& f) {
    const int before = wal_syncs.load();
    f();
    return wal_syncs.load() - before;
  };
  const int plain = syncs_of([&] {
    for (int i = 0; i < cycles; ++i) {
      lease_lock lock(db, "job/" + std::to_string(i));
      lock.try_acquire()->release();  // one acquire, one release
    }
  });
  const int reentrant = syncs_of([&] {
    for (int i = 0; i < cycles; ++i) {
      lease_lock lock(db, "re/" + std::to_string(i));
      auto g = lock.try_acquire();
      lock.try_acquire()->release();  // a reentry and a release that keeps the lease
      g->release();
    }
  });
  const int forced = syncs_of([&] {
    for (int i = 0; i < cycles; ++i)
      (void)dblock::force_release(db, "job/" + std::to_string(i), "test", "fast_leases_test");
  });
  INFO("WAL syncs for " << cycles << " acquire+release: " << plain
                        << "; acquire, reentry, 2 releases: " << reentrant
                        << "; forced releases: " << forced);
  // The acquires' commits sync (a checkpoint may add a few); the releases' do not.
  CHECK(plain >= cycles);
  CHECK(plain < cycles + cycles / 4);
  CHECK(reentrant >= 2 * cycles);
  CHECK(reentrant < 2 * cycles + cycles / 4);
  CHECK(forced >= cycles);  // negative control: a forced release waits for the disk
  long long level = -1;
  db.connect().session() << "PRAGMA synchronous", soci::into(level);
  CHECK(level == 2);  // FULL, the connection's own level, after every release
}

// SQLite: a waiting acquire's own queue writes (its entry, the entry's refreshes every ttl/3, its
// deletion when the wait gives up) commit without syncing the WAL, as a release does: an entry
// decides no grant, and the OS crash that could undo one ends its waiter too. The grant syncs.
DBLOCK_TEST_ONLY("sqlite", "a waiter's queue writes skip the sync of the WAL, its grant does not",
                 "[lease][durability][waiting]") {
  counting_vfs counting;
  dblock::database a = ctx.open(), b = ctx.open();  // both connect through the counting VFS
  const std::string name = "queued/" + dblock::test::random_suffix();
  lease_lock warm(b, "warm-up/" + dblock::test::random_suffix());
  warm.try_acquire()->release();
  lease_lock holder(a, name);
  auto h = holder.try_acquire();
  REQUIRE(h);
  auto entry_expiry = [&] {
    auto c = ctx.db.connect();  // not through the counting VFS: its syncs are not counted
    long long e = 0;
    c.session() << "SELECT max(expires_at) FROM " << ctx.table("lock_waiter")
                << " WHERE resource_name = :n",
        soci::use(name), soci::into(e);
    return e;
  };
  dblock::lease_options wo;
  wo.ttl = std::chrono::milliseconds(600);  // the entry is refreshed every 200 ms
  lease_lock waiter(b, name, wo);
  const int before_wait = wal_syncs.load();
  std::optional<dblock::lease_guard> got;
  std::thread t([&] { got.emplace(waiter.acquire(std::chrono::milliseconds(20000))); });
  REQUIRE(dblock::test::wait_for_waiters(ctx, name, 1, std::chrono::milliseconds(10000)));
  const long long first_expiry = entry_expiry();
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  const long long later_expiry = entry_expiry();
  const int queued = wal_syncs.load() - before_wait;
  const int before_release = wal_syncs.load();
  h->release();
  t.join();
  REQUIRE(got);
  const int granted = wal_syncs.load() - before_release;
  // A wait that gives up: its entry, a refresh or two, and its deletion (in a handle of its
  // own: in b it would wait at b's local gate, behind the holder).
  dblock::database c = ctx.open();
  lease_lock late(c, name, wo);
  const int before_timeout = wal_syncs.load();
  CHECK(code_of([&] { (void)late.acquire(std::chrono::milliseconds(500)); }) == errc::timeout);
  const int gave_up = wal_syncs.load() - before_timeout;
  CHECK(dblock::test::count_waiters(ctx, name) == 0);
  INFO("WAL syncs: queued for 0.9 s " << queued << ", release and grant " << granted
                                      << ", a wait that timed out " << gave_up);
  CHECK(later_expiry >= first_expiry + 300000);  // the entry was refreshed meanwhile (us)
  CHECK(queued == 0);
  CHECK(gave_up == 0);
  CHECK(granted == 1);  // negative control: the grant syncs the WAL
  got->release();
}

// SQLite: a fair release that hands the lease to the head of the queue commits that handover
// durably, once, and the head then holds the lease without a write of its own: one sync of the
// WAL for the whole handoff, as for a release and an acquire. (Handed over unsynced, the count
// would be 0; the head's own acquire after a plain release would make it 1 as well, so the row
// shows the handover: it names no holder thread.)
DBLOCK_TEST_ONLY("sqlite", "a fair handover syncs the WAL once, and the head's take not at all",
                 "[lease][durability][handover]") {
  counting_vfs counting;
  dblock::database a = ctx.open(), b = ctx.open();  // both connect through the counting VFS
  const std::string name = "handed/" + dblock::test::random_suffix();
  dblock::lease_options fair;
  fair.fair = true;
  fair.ttl = std::chrono::seconds(30);
  // W polls rarely: a poll between the handover's commit and its ring would find the lease W's
  // and take it with an acquire of its own (a durable write that names W's thread).
  dblock::lease_options rare = fair;
  rare.poll_max = std::chrono::seconds(20);
  lease_lock first(a, name, fair), holder(a, name, fair), next(b, name, rare);
  // H comes through the queue, so its release may hand the lease over.
  dblock::lease_guard h = dblock::test::acquire_through_queue(ctx, name, first, holder);
  std::optional<dblock::lease_guard> w;
  std::thread tw([&] { w.emplace(next.acquire(std::chrono::milliseconds(20000))); });
  REQUIRE(dblock::test::wait_for_waiters(ctx, name, 1, std::chrono::milliseconds(10000)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // W sleeps, its entry made
  const int before = wal_syncs.load();
  const std::int64_t fence = h.fence();
  h.release();
  tw.join();
  REQUIRE(w);
  const int handoff = wal_syncs.load() - before;
  std::string thread;
  {
    auto c = ctx.db.connect();  // not through the counting VFS
    c.session() << "SELECT holder_thread FROM " << ctx.table("resource_lock")
                << " WHERE resource_name = :n",
        soci::use(name), soci::into(thread);
  }
  INFO("WAL syncs for the handing release and the head's take: " << handoff);
  CHECK(w->fence() == fence + 1);
  CHECK(thread.empty());  // handed over in the release, not taken by W's acquire
  CHECK(handoff == 1);
  w->release();
}
