// Lost replies. First, a regression test for a lost-reply resolution bug found by scenario 2
// (connection_cut_test.cpp), fixed by ending the broken server session before reading the row
// back.
//
// try_acquire's upsert waits on the lock row, which a holder's fenced() transaction has locked.
// The connection is reset meanwhile; lease_lock resolves the lost reply by reading the row at
// once, sees the holder's row and reports "not acquired". The server still runs the upsert: when
// the holder commits (its lease has expired by then), the upsert took the row under our owner
// token: the row then carried an unexpired lease of ours although we were told "not acquired"
// (docs/safety.md E1). Now the old session is ended first, so the read-back is final.
#include <soci/soci.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <thread>

#include "dblock/semaphore.hpp"
#include "dialect/postgresql/backend.hpp"
#include "fault_support.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "proxy.hpp"
#include "waiting_support.hpp"

using namespace dblock;
using namespace dblock::test;

namespace {

// Fair, a TTL far above the tests' waits, and polling every 300 ms where a ring is lost.
lease_options fair_30s() {
  lease_options o;
  o.fair = true;
  o.ttl = milliseconds(30000);
  o.poll_max = milliseconds(300);
  return o;
}

}  // namespace

DBLOCK_TEST_SERVERS(
    "a lost reply of an upsert waiting on a row lock is never a false 'not acquired'",
    "[faults][lost-reply]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  const std::string name = "bug-" + random_suffix();
  lease_options short_ttl;
  short_ttl.ttl = milliseconds(300);
  lease_lock holder_lock(ctx.db, name, short_ttl);
  auto h = holder_lock.try_acquire();
  REQUIRE(h);
  // The holder keeps the lock row locked for 1.5 s inside fenced(); its lease expires at 300 ms.
  std::thread holder([&] {
    try {
      h->fenced([](soci::session&) { std::this_thread::sleep_for(milliseconds(1500)); });
    } catch (const std::exception&) {
    }
  });
  std::this_thread::sleep_for(milliseconds(500));  // the holder's lease has expired
  auto via = open_db(url_via(ctx.url, proxy.port()), ctx.prefix, 2);
  via.ping();
  lease_options lo;
  lo.ttl = milliseconds(10000);
  lease_lock contender(via, name, lo);
  std::thread cutter([&] {
    std::this_thread::sleep_for(milliseconds(300));  // the upsert is waiting on the row lock
    proxy.cut_all();
  });
  std::optional<errc> code;
  bool acquired = false;
  try {
    acquired = contender.try_acquire().has_value();
  } catch (const error& e) {
    code = e.kind();
  }
  cutter.join();
  holder.join();
  std::this_thread::sleep_for(milliseconds(300));  // the orphaned upsert has committed by now
  auto c = ctx.db.connect();
  auto row = dblock::test::read_lease(c, name);
  REQUIRE(row);
  const bool ours = row->holder_pid == ::getpid() && row->fence > h->fence() &&
                    row->hold_count > 0 && row->expires_at_us > row->now_us;
  INFO("acquired " << acquired << ", error " << (code ? to_string(*code) : "none") << ", row fence "
                   << row->fence << " pid " << row->holder_pid);
  // Acceptable: acquired, in_doubt, or not acquired with a row that is not ours.
  CHECK((acquired || code == errc::in_doubt || !ours));
}

// The reply of a release that hands the lease to the next fair waiter (PostgreSQL; elsewhere
// the release that frees it) is lost. The holder's release() resolves it by reading the row:
// on PostgreSQL the lease is no longer its own (handed over), elsewhere it is free; either way
// release() returns. The waiter, whose ring the lost reply took with it on PostgreSQL, finds
// the lease its own at its next read (poll_max 300 ms) and holds it once, at the next fence.
// Holder and waiter connect through the proxy, one URL, so that they share a host relay.
DBLOCK_TEST_SERVERS("a lost reply of a release that hands the lease over loses no grant",
                    "[faults][lost-reply]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  const std::string name = "handover-lost-reply-" + random_suffix();
  const std::string url = url_via(ctx.url, proxy.port());
  const lease_options fair = fair_30s();
  lease_lock x_lock(ctx.db, name, fair);
  auto x = x_lock.try_acquire();
  REQUIRE(x);
  auto holder_db = open_db(url, ctx.prefix, 2);
  lease_lock holder_lock(holder_db, name, fair);
  std::optional<lease_guard> h;
  std::thread holder([&] { h.emplace(holder_lock.acquire(milliseconds(20000))); });
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  x->release();
  holder.join();  // H came through the queue
  REQUIRE(h);
  auto waiter_db = open_db(url, ctx.prefix, 2);
  lease_lock waiter_lock(waiter_db, name, fair);
  std::optional<lease_guard> w;
  std::string failure;
  std::thread waiter([&] {
    try {
      w.emplace(waiter_lock.acquire(milliseconds(20000)));
    } catch (const std::exception& e) {
      failure = e.what();
    }
  });
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(10000)));
  const std::string lock_table = ctx.prefix + "resource_lock";
  proxy.cut_reply_to(ctx.backend == "postgresql"
                         ? std::string("dblock_lease_release_granting")
                         : faults::renew_release_request_pattern(ctx.url, lock_table));
  const std::int64_t fence = h->fence();
  std::optional<errc> code;
  try {
    h->release();
  } catch (const error& e) {
    code = e.kind();
  }
  waiter.join();
  const long long cuts = proxy.cuts();
  proxy.cut_reply_to("");  // disarm, had it not fired
  INFO("release: " << (code ? to_string(*code) : "returned") << "; waiter: " << failure);
  CHECK(cuts == 1);  // the release's reply was lost
  CHECK_FALSE(code);
  REQUIRE(w);
  CHECK(w->fence() == fence + 1);
  auto c = ctx.db.connect();
  auto row = dblock::test::read_lease(c, name);
  REQUIRE(row);
  CHECK(row->hold_count == 1);
  CHECK(row->fence == fence + 1);
  w->release();
}

// A reentrant hold's release (2 holds -> 1) whose reply is lost, and whose read-back then loses
// its connection too: only the read is tried again. Sent again blindly, the release would take
// the last hold as well and free a lease still in use.
DBLOCK_TEST_SERVERS("a lost release reply whose read-back also breaks never repeats the release",
                    "[faults][lost-reply]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  const std::string name = "release-read-cut-" + random_suffix();
  auto via = open_db(url_via(ctx.url, proxy.port()), ctx.prefix, 2);
  lease_lock lk(via, name);
  auto outer = lk.try_acquire();
  REQUIRE(outer);
  auto inner = lk.try_acquire();  // reentrant: hold count 2
  REQUIRE(inner);
  const std::string lock_table = ctx.prefix + "resource_lock";
  proxy.cut_reply_to(faults::renew_release_request_pattern(ctx.url, lock_table));
  proxy.cut_request_to(ctx.backend == "postgresql"
                           ? std::string("dblock_read")
                           : "SELECT resource_name, owner_token, fence, hold_count",
                       false);
  std::optional<errc> code;
  try {
    inner->release();
  } catch (const error& e) {
    code = e.kind();
  }
  const long long cuts = proxy.cuts();
  proxy.cut_reply_to("");
  proxy.cut_request_to("", false);
  INFO("release: " << (code ? to_string(*code) : "returned"));
  CHECK(cuts == 2);  // the release's reply, then the read-back's request
  CHECK_FALSE(code);
  auto c = ctx.db.connect();
  auto row = dblock::test::read_lease(c, name);
  REQUIRE(row);
  CHECK(row->hold_count == 1);  // the outer hold is still in use
  CHECK(row->fence == outer->fence());
  CHECK(row->expires_at_us > row->now_us);
  CHECK(outer->valid());
  outer->release();
  row = dblock::test::read_lease(c, name);
  REQUIRE(row);
  CHECK(row->hold_count == 0);
}

namespace {

// The lost-insert-reply scenario for any kind that waits: `make(db)` makes the lock object (a
// lease_lock, a semaphore of one permit) on handle `db`, whose acquire(wait) waits for what
// `holder` holds, queueing in `queue`. W waits
// through a proxy that loses its queue insert's reply; Y queues behind it; the holder releases.
// Returns Y's guard, after checking that the reply was lost, that W got its turn and that no
// entry is left once Y releases.
template <class Make>
lease_guard check_lost_insert_reply(const context& ctx, const std::string& queue,
                                    std::optional<lease_guard>& holder, Make make) {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  auto via = open_db(url_via(ctx.url, proxy.port()), ctx.prefix, 2);
  via.ping();
  auto w_lock = make(via);
  auto y_lock = make(ctx.db);
  // On PostgreSQL the statement is prepared in a round trip of its own first: the pattern is
  // its execution's Bind message (the statement's name, then no format codes, 7 parameters).
  const std::string bind =
      dblock::detail::pg::prepared_name(dblock::test::statements_of(via).waiter_insert) +
      std::string("\0\0\0\0\x07", 5);
  proxy.cut_reply_to(ctx.backend == "postgresql" ? bind
                                                 : "INSERT INTO " + ctx.table("lock_waiter"));
  std::optional<lease_guard> w, y;
  std::string w_failure, y_failure;
  std::thread waiter([&] {
    try {
      w.emplace(w_lock.acquire(milliseconds(15000)));
      std::this_thread::sleep_for(milliseconds(50));
      w->release();
    } catch (const std::exception& e) {
      w_failure = e.what();
    }
  });
  REQUIRE(wait_for_waiters(ctx, queue, 1, milliseconds(10000)));
  std::this_thread::sleep_for(milliseconds(300));  // W has resolved its lost reply by now
  std::thread behind([&] {
    try {
      y.emplace(y_lock.acquire(milliseconds(8000)));  // far below the entry TTL
    } catch (const std::exception& e) {
      y_failure = e.what();
    }
  });
  REQUIRE(wait_for_waiters(ctx, queue, 2, milliseconds(10000)));
  holder->release();
  waiter.join();
  behind.join();
  const long long cuts = proxy.cuts();
  proxy.cut_reply_to("");  // disarm, had it not fired
  INFO("waiter: " << w_failure << "; the waiter behind: " << y_failure);
  CHECK(cuts == 1);  // the insert's reply was lost
  CHECK(w_failure.empty());
  REQUIRE(y);
  lease_guard out = std::move(*y);
  return out;
}

}  // namespace

// The reply to a fair waiter's queue insert is lost. The entry was made, and nothing else would
// ever refresh or delete it: left alone it would stay at the head of the queue for the lease
// TTL (30 s here), the next waiter behind it, and a release could hand it the lease. The waiter
// reads its entry back by owner token once the broken session is ended and waits on with it:
// it is granted the lease in its turn, the waiter behind it right after, and no entry is left.
DBLOCK_TEST_SERVERS("a lost reply of a queue insert leaves no orphan entry at the head",
                    "[faults][lost-reply]") {
  const std::string name = "enqueue-lost-reply-" + random_suffix();
  const lease_options fair = fair_30s();
  lease_lock x_lock(ctx.db, name, fair);
  std::optional<lease_guard> x = x_lock.try_acquire();
  REQUIRE(x);
  const std::int64_t fence = x->fence();
  lease_guard y = check_lost_insert_reply(
      ctx, name, x, [&](const database& db) { return lease_lock(db, name, fair); });
  CHECK(y.fence() == fence + 2);  // W held it in between
  y.release();
  CHECK(count_waiters(ctx, name) == 0);
}

// The same for a fair semaphore's waiter: every kind waits through one engine (lease/queue_wait),
// so its waiter reads its entry back too. Before they shared it, the semaphore's waiter made a
// second entry behind the orphan, and it and the waiter behind it waited for the orphan's 30 s
// TTL (seen failing: both timed out).
DBLOCK_TEST_SERVERS("a lost reply of a semaphore waiter's queue insert leaves no orphan entry",
                    "[faults][lost-reply]") {
  const std::string name = "sem-enqueue-lost-reply-" + random_suffix();
  const std::string queue = name + "\xEF\xBF\xBFQ";
  REQUIRE(dblock::semaphore::queue_of(queue) == name);
  const lease_options fair = fair_30s();
  dblock::semaphore x_sem(ctx.db, name, 1, fair);
  std::optional<lease_guard> x = x_sem.try_acquire();
  REQUIRE(x);
  lease_guard y = check_lost_insert_reply(
      ctx, queue, x, [&](const database& db) { return dblock::semaphore(db, name, 1, fair); });
  y.release();
  CHECK(count_waiters(ctx, queue) == 0);
}

// A renewal whose reply is lost is sent again (a renewal decides the same when repeated): the
// call returns renewed, the lease stays valid, and the row's expiry moved out. The fault is
// proved: the proxy cut exactly one reply.
DBLOCK_TEST_SERVERS("a lost renew reply is resolved by sending the renewal again",
                    "[faults][lost-reply]") {
  auto [host, port] = url_host_port(ctx.url);
  tcp_proxy proxy(host, port);
  const std::string name = "renew-lost-reply-" + random_suffix();
  auto via = open_db(url_via(ctx.url, proxy.port()), ctx.prefix, 2);
  lease_options o;
  o.ttl = milliseconds(5000);
  lease_lock lk(via, name, o);
  auto g = lk.try_acquire();
  REQUIRE(g);
  auto c = ctx.db.connect();
  auto before = dblock::test::read_lease(c, name);
  REQUIRE(before);
  std::this_thread::sleep_for(milliseconds(50));  // the renewal's expiry is visibly later
  proxy.cut_reply_to(faults::renew_release_request_pattern(ctx.url, ctx.prefix + "resource_lock"));
  std::optional<errc> code;
  try {
    g->renew();
  } catch (const error& e) {
    code = e.kind();
  }
  const long long cuts = proxy.cuts();
  proxy.cut_reply_to("");
  INFO("renew: " << (code ? to_string(*code) : "returned"));
  CHECK(cuts == 1);  // the fault happened
  CHECK_FALSE(code);
  CHECK(g->valid());
  auto after = dblock::test::read_lease(c, name);
  REQUIRE(after);
  CHECK(after->owner_token == before->owner_token);
  CHECK(after->fence == before->fence);
  CHECK(after->expires_at_us > before->expires_at_us);
  g->release();
}
