// Wake-ups shared by the handles of one host. Every backend: handles of one host that wait on one
// lock are each rung. PostgreSQL (the wake-up relay, database_options::share_listener, see
// docs/waiting.md): they share one LISTEN connection (one each without it, the negative
// control), the leading process killed with SIGKILL is replaced and the next release still rings,
// a relay directory that cannot be used leaves the handle listening alone, with a warning, and a
// release rings a waiter that shares its relay directory itself, without a NOTIFY (a waiter it
// cannot reach it notifies).
#include <signal.h>
#include <soci/postgresql/soci-postgresql.h>
#include <soci/soci.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "waiting_support.hpp"

using namespace dblock::test;

namespace {

// `url` whose connections are named `tag` (application_name), to find them on the server.
std::string tagged(const std::string& url, const std::string& tag) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "application_name=" + tag;
}

// A waiter's own handle; on PostgreSQL its listener connects as `tag`.
dblock::database waiting_handle(const dblock::test::context& ctx, const std::string& tag,
                                bool share, std::shared_ptr<dblock::listener> events = {}) {
  auto o = ctx.options();
  o.events = std::move(events);
  o.share_listener = share;
  if (ctx.backend == "postgresql") o.listen_url = tagged(ctx.url, tag);
  return ctx.open(o);
}

// Server process ids of the PostgreSQL connections named `tag` that LISTEN.
std::vector<long long> listeners(const dblock::test::context& ctx, const std::string& tag) {
  auto c = ctx.db.connect();
  std::vector<long long> pids(64);
  c.session() << "SELECT pid FROM pg_stat_activity WHERE application_name = :a AND query LIKE "
                 "'LISTEN%'",
      soci::use(tag), soci::into(pids);
  return pids;
}

// Polls listeners() until `ok` holds for them, up to `limit`; the last answer.
template <class Pred>
std::vector<long long> await_listeners(const dblock::test::context& ctx, const std::string& tag,
                                       Pred ok, milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  auto l = listeners(ctx, tag);
  while (!ok(l) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
    l = listeners(ctx, tag);
  }
  return l;
}

dblock::lease_guard hold(const dblock::test::context& ctx, const std::string& name) {
  dblock::lease_options ho;
  ho.ttl = std::chrono::seconds(60);  // only its release frees it soon
  dblock::lease_lock holder(ctx.db, name, ho);
  auto h = holder.try_acquire();
  REQUIRE(h);
  return std::move(*h);
}

// PostgreSQL: a connection of its own that LISTENs on `channel`, and what it heard.
class raw_listener {
 public:
  raw_listener(const dblock::test::context& ctx, const std::string& channel)
      : db_(ctx.open(ctx.options())), c_(db_.connect()) {
    pg_ = static_cast<soci::postgresql_session_backend*>(c_.session().get_backend())->conn_;
    c_.session() << ("LISTEN \"" + channel + "\"");
  }
  /// The payloads of the notifications that arrive within `wait`.
  std::vector<std::string> heard(milliseconds wait) {
    std::vector<std::string> out;
    const auto until = std::chrono::steady_clock::now() + wait;
    while (std::chrono::steady_clock::now() < until) {
      PQconsumeInput(pg_);
      while (PGnotify* n = PQnotifies(pg_)) {
        out.emplace_back(n->extra ? n->extra : "");
        PQfreemem(n);
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    return out;
  }

 private:
  dblock::database db_;
  dblock::database::connection c_;
  PGconn* pg_ = nullptr;
};

// The bell of `name`'s queue entry (there is one).
std::string entry_bell(const dblock::test::context& ctx, const std::string& name) {
  auto c = ctx.db.connect();
  std::string bell;
  c.session() << "SELECT CAST(bell AS TEXT) FROM " + ctx.prefix +
                     "lock_waiter WHERE resource_name = :n",
      soci::use(name), soci::into(bell);
  return bell;
}

// Waits for `name` with `db` on a thread of its own (poll_max 20 s: only a ring makes it quick),
// noting when it was granted, or the error.
std::thread wait_on_thread(dblock::database& db, const std::string& name,
                           std::atomic<long long>& granted, std::string& error) {
  return std::thread([&db, name, &granted, &error] {
    try {
      dblock::lease_options lo;
      lo.ttl = std::chrono::seconds(30);
      lo.poll_max = std::chrono::seconds(20);
      dblock::lease_lock lk(db, name, lo);
      auto g = lk.acquire(std::chrono::seconds(60));
      granted.store(monotonic_ns());
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
}

struct round_result {
  std::vector<long long> listening;  // PostgreSQL: LISTEN connections while all waited
  std::vector<std::uint64_t> woken;  // per handle
  long long last_grant_ms = -1;      // after the release
  int granted = 0;
  std::string errors;
};

// `n` handles of this process wait on one held lock (poll_max 20 s: only rings make the round
// quick), then the holder releases and each takes it in turn for 20 ms.
round_result hand_around(const dblock::test::context& ctx, int n, bool share) {
  const std::string tag = "dblock_relay_" + dblock::test::random_suffix();
  const std::string name = "relay-" + dblock::test::random_suffix();
  auto h = hold(ctx, name);
  std::vector<std::shared_ptr<counting_listener>> events;
  std::vector<dblock::database> dbs;
  for (int i = 0; i < n; ++i) {
    events.push_back(std::make_shared<counting_listener>());
    dbs.push_back(waiting_handle(ctx, tag, share, events.back()));
  }
  // Each handle listens before its waiter comes (a probe keeps it listening meanwhile), so that
  // the waiter is confirmed as it enlists and sleeps relying on rings from its first read.
  std::vector<std::unique_ptr<ring_probe>> early;
  bool listening = true;
  for (auto& d : dbs) {
    early.push_back(std::make_unique<ring_probe>(d));
    listening = listening && early.back()->wait_reached(milliseconds(20000));
  }
  round_result r;
  std::mutex mu;
  std::atomic<long long> released{0}, last{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      try {
        dblock::lease_options lo;
        lo.ttl = std::chrono::seconds(30);
        lo.poll_max = std::chrono::seconds(20);
        dblock::lease_lock lk(dbs[i], name, lo);
        auto g = lk.acquire(std::chrono::seconds(60));
        const long long t = monotonic_ns();
        if (t > last.load()) last.store(t);
        std::this_thread::sleep_for(milliseconds(20));
        g.release();
        std::lock_guard<std::mutex> l(mu);
        ++r.granted;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> l(mu);
        r.errors += std::string(e.what()) + "\n";
      }
    });
  bool queued = wait_for_waiters(ctx, name, n, milliseconds(20000));
  // Every waiter confirmed by its handle's listener (PostgreSQL: the LISTEN connections are in
  // place, as the count below needs).
  for (auto& d : dbs)
    queued = queued && wait_rings_reach(d, milliseconds(20000)) && let_confirmation_look_end(d);
  if (ctx.backend == "postgresql") r.listening = listeners(ctx, tag);
  released.store(monotonic_ns());
  h.release();
  for (auto& t : ts)
    t.join();
  REQUIRE(listening);
  REQUIRE(queued);
  r.last_grant_ms = (last.load() - released.load()) / ns_per_ms;
  for (const auto& e : events)
    r.woken.push_back(e->woken_n.load());
  return r;
}

}  // namespace

// args: url prefix name tag
// Waits for `name` with its own handle (listener named `tag`, waiter TTL 1 s) until killed.
DBLOCK_WORKER(relay_waiter) {
  auto o = dblock::test::with_prefix(args.at(1));
  o.listen_url = tagged(args.at(0), args.at(3));
  dblock::database db(args.at(0), o);
  dblock::lease_options lo;
  lo.ttl = milliseconds(1000);
  lo.poll_max = std::chrono::seconds(30);
  dblock::lease_lock lock(db, args.at(2), lo);
  auto g = lock.acquire(std::chrono::seconds(120));
  return 0;
}

// [direct]: rings across handles need LISTEN, which PgBouncer's transaction mode cannot carry.
DBLOCK_TEST(
    "handles of one host waiting on one lock are each rung; on PostgreSQL they share "
    "one listener",
    "[waiting][direct]") {
  const int n = 4;
  const auto r = hand_around(ctx, n, true);
  INFO(r.errors << "last grant " << r.last_grant_ms << " ms after the release");
  REQUIRE(r.granted == n);
  for (int i = 0; i < n; ++i) {
    INFO("handle " << i);
    CHECK(r.woken[static_cast<std::size_t>(i)] >= 1);  // rung, not found by a poll
  }
  CHECK(r.last_grant_ms <
        scaled_bound_ms(ctx.db, 5000));  // a handle that missed its ring would sleep up to 20 s
  if (ctx.backend == "postgresql") {
    CHECK(r.listening.size() == 1);
    // Negative control: a listener per handle.
    const auto own = hand_around(ctx, n, false);
    INFO(own.errors);
    REQUIRE(own.granted == n);
    CHECK(own.listening.size() == static_cast<std::size_t>(n));
  }
}

DBLOCK_TEST_ONLY("postgresql",
                 "wake-up relay: the leading process killed with SIGKILL, another takes over and "
                 "the next release still rings",
                 "[waiting][process][direct]") {
  const std::string tag = "dblock_relay_" + dblock::test::random_suffix();
  const std::string name = "relay-kill-" + dblock::test::random_suffix();
  auto h = hold(ctx, name);
  process_set ps;
  // A waits first, so it leads: the one LISTEN connection named `tag` is its.
  const int a = ps.spawn("relay_waiter", {ctx.url, ctx.prefix, name, tag});
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(20000)));
  const auto before = await_listeners(
      ctx, tag, [](const auto& l) { return l.size() == 1; }, milliseconds(10000));
  REQUIRE(before.size() == 1);
  // B, in this process, follows.
  std::atomic<long long> granted{0};
  std::string error;
  auto bdb = waiting_handle(ctx, tag, true);
  ring_probe early(bdb);  // B's handle confirms its waiter as it enlists (see waiting_support)
  std::thread b([&] {
    try {
      dblock::lease_options lo;
      lo.ttl = std::chrono::seconds(30);       // its queue entry is refreshed every 10 s only
      lo.poll_max = std::chrono::seconds(30);  // so only a ring makes it quick
      dblock::lease_lock lk(bdb, name, lo);
      auto g = lk.acquire(std::chrono::seconds(120));
      granted.store(monotonic_ns());
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  // B queued and its handle's listener confirmed it: the release can ring it.
  const bool queued = wait_for_waiters(ctx, name, 2, milliseconds(20000)) &&
                      wait_rings_reach(bdb, milliseconds(20000)) && let_confirmation_look_end(bdb);
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  const auto both = listeners(ctx, tag);
  REQUIRE(::kill(a, SIGKILL) == 0);
  const long long killed = monotonic_ns();
  CHECK(ps.wait(a, milliseconds(5000)) == 128 + SIGKILL);
  // B leads now: one LISTEN connection again, not A's.
  const auto after = await_listeners(
      ctx, tag, [&](const auto& l) { return l.size() == 1 && l[0] != before[0]; },
      milliseconds(5000));
  const long long took_over = monotonic_ns();
  // A's queue entry is expired by then (its TTL is 1 s), so the release rings B.
  std::this_thread::sleep_for(milliseconds(1500) - std::chrono::nanoseconds(took_over - killed));
  const long long released = monotonic_ns();
  h.release();
  b.join();
  INFO(error << "; takeover " << (took_over - killed) / ns_per_ms << " ms; B granted "
             << (granted.load() - released) / ns_per_ms << " ms after the release; bound " << bound
             << " ms");
  REQUIRE(queued);
  CHECK(both.size() == 1);
  REQUIRE(after.size() == 1);
  CHECK(after[0] != before[0]);
  REQUIRE(granted.load() > 0);
  CHECK(granted.load() - released < bound * ns_per_ms);  // polling would sleep up to 30 s
}

DBLOCK_TEST_ONLY("postgresql",
                 "wake-up relay: a directory that cannot be used leaves the handle listening "
                 "alone, with a warning",
                 "[waiting][direct]") {
  temp_dir dir("relay");
  ::chmod(dir.path.c_str(), 0700);
  { std::ofstream(dir.path + "/dblock") << "not a directory\n"; }
  const char* old = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = old ? old : "";
  ::setenv("XDG_RUNTIME_DIR", dir.path.c_str(), 1);
  struct restore {
    const char* had;
    std::string value;
    ~restore() {
      if (had)
        ::setenv("XDG_RUNTIME_DIR", value.c_str(), 1);
      else
        ::unsetenv("XDG_RUNTIME_DIR");
    }
  } restore_env{old, saved};
  const std::string tag = "dblock_relay_" + dblock::test::random_suffix();
  const std::string name = "relay-alone-" + dblock::test::random_suffix();
  auto events = std::make_shared<counting_listener>();
  auto wdb = waiting_handle(ctx, tag, true, events);
  auto h = hold(ctx, name);
  std::atomic<long long> granted{0};
  std::string error;
  ring_probe early(wdb);
  std::thread t = wait_on_thread(wdb, name, granted, error);
  const bool queued = wait_for_waiters(ctx, name, 1, milliseconds(20000)) &&
                      wait_rings_reach(wdb, milliseconds(20000));
  const auto l = await_listeners(
      ctx, tag, [](const auto& x) { return x.size() == 1; }, milliseconds(5000));
  const bool asleep = let_confirmation_look_end(wdb);
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  const long long released = monotonic_ns();
  h.release();
  t.join();
  INFO(error << "; granted " << (granted.load() - released) / ns_per_ms
             << " ms after the release; bound " << bound << " ms; logged: " << events->logged());
  REQUIRE(queued);
  REQUIRE(asleep);
  CHECK(l.size() == 1);
  CHECK(events->logged().find("this handle listens alone") != std::string::npos);
  CHECK(events->woken_n.load() >= 1);
  REQUIRE(granted.load() > 0);
  CHECK(granted.load() - released < bound * ns_per_ms);
}

DBLOCK_TEST_ONLY("postgresql",
                 "wake-up relay: a release rings a waiter of its own relay directory itself, "
                 "without a NOTIFY; a waiter it cannot reach there it notifies",
                 "[waiting][direct]") {
  const std::string tag = "dblock_relay_" + dblock::test::random_suffix();
  const std::string name = "relay-direct-" + dblock::test::random_suffix();
  // The holder's handle connects as the waiter's does, so both meet in one relay directory.
  auto hdb = waiting_handle(ctx, tag, true);
  auto events = std::make_shared<counting_listener>();
  auto wdb = waiting_handle(ctx, tag, true, events);
  dblock::lease_options ho;
  ho.ttl = std::chrono::seconds(60);
  dblock::lease_lock holder(hdb, name, ho);
  auto h = holder.try_acquire();
  REQUIRE(h);
  std::atomic<long long> granted{0};
  std::string error;
  ring_probe early(wdb);
  std::thread t = wait_on_thread(wdb, name, granted, error);
  REQUIRE(wait_for_waiters(ctx, name, 1, milliseconds(20000)));
  REQUIRE(wait_rings_reach(wdb, milliseconds(20000)));
  const std::string bell = entry_bell(ctx, name);
  INFO("the waiter's bell: " << bell);
  REQUIRE(bell.size() == 32);
  REQUIRE(bell[16] == '.');
  const std::string host = bell.substr(0, 16);
  raw_listener heard(ctx, "dblock_w_" + host);  // where the release would notify it
  REQUIRE(let_confirmation_look_end(wdb));      // the waiter relies on rings by now
  const long long bound = scaled_bound_ms(ctx.db, 2000);
  const long long released = monotonic_ns();
  h->release();
  t.join();
  INFO(error << "; granted " << (granted.load() - released) / ns_per_ms
             << " ms after the release; bound " << bound << " ms; logged: " << events->logged());
  REQUIRE(granted.load() > 0);
  CHECK(granted.load() - released < bound * ns_per_ms);  // rung (a poll would take 20 s)
  CHECK(events->woken_n.load() >= 1);
  CHECK(heard.heard(milliseconds(300)).empty());  // rung directly: no NOTIFY

  // A head the releasing process cannot ring there (no such handle directory): it notifies it
  // after all, on the channel and with the payload the release would have used.
  const std::string fake_handle = "f00d" + std::string(11, '0');
  const std::string fake_token(32, 'e');
  auto h2 = holder.try_acquire();
  REQUIRE(h2);
  {
    auto c = ctx.db.connect();
    const std::string fake_bell = host + "." + fake_handle;
    c.session() << "INSERT INTO " + ctx.prefix +
                       "lock_waiter (resource_name, owner_token, enqueued_at, expires_at,"
                       " holder_host, holder_pid, bell) VALUES (:n, :t, clock_timestamp(),"
                       " clock_timestamp() + INTERVAL '60 seconds', 'elsewhere', 1, :b)",
        soci::use(name), soci::use(fake_token), soci::use(fake_bell);
  }
  h2->release();
  const auto payloads = heard.heard(milliseconds(1000));
  REQUIRE(payloads.size() == 1);
  CHECK(payloads[0].find(":" + fake_token + "@" + fake_handle + ":" + name) != std::string::npos);
}
