// Operations API (admin.hpp) and observability (listener.hpp, prometheus.hpp) on each backend:
// list_locks (filters, patterns, fields, limit), force_release and its audit trail
// (recent_forced_releases), the order of listener events in scripted scenarios (contention,
// forced release, watchdog, reaper), and the Prometheus text of the same scenario.
#include <soci/soci.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <mutex>
#include <regex>
#include <sstream>
#include <thread>

#include "harness.hpp"
#include "internals.hpp"

#ifdef DBLOCK_TEST_PROMETHEUS
#include <prometheus/registry.h>
#include <dblock/prometheus.hpp>
#endif

using dblock::lease_lock;
using dblock::lease_options;
using dblock::list_options;
using namespace dblock::test;

namespace {

std::vector<std::string> names_of(const std::vector<dblock::lock_info>& v) {
  std::vector<std::string> out;
  for (const auto& l : v)
    out.push_back(l.name);
  return out;
}

// Names matching `pattern`, sorted here (byte order) so that the check does not depend on the
// ORDER BY collation.
std::vector<std::string> matching(const dblock::database& db, const std::string& pattern,
                                  bool include_free = false) {
  list_options o;
  o.pattern = pattern;
  o.include_free = include_free;
  auto v = names_of(dblock::list_locks(db, o));
  std::sort(v.begin(), v.end());
  return v;
}

const dblock::lock_info* find(const std::vector<dblock::lock_info>& v, const std::string& name) {
  for (const auto& l : v)
    if (l.name == name) return &l;
  return nullptr;
}

long long seconds_from_now(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::seconds>(t - std::chrono::system_clock::now())
      .count();
}

// ---- a listener that records what it hears --------------------------------------------------

struct event {
  event(std::string k, std::string n) : kind(std::move(k)), name(std::move(n)) {}
  std::string kind;
  std::string name;
  std::int64_t fence = 0;
  std::uint64_t rows = 0;
  std::uint64_t batches = 0;
  errc code = errc::backend_error;
  std::thread::id thread;
};

class recorder : public dblock::listener {
 public:
  void acquired(std::string_view name, std::int64_t fence, std::chrono::microseconds l) override {
    event e{"acquired", std::string(name)};
    e.fence = fence;
    if (l.count() < 0) e.kind = "acquired(negative latency)";
    push(e);
  }
  void contended(std::string_view name) override { push(event("contended", std::string(name))); }
  void retried(std::string_view op, const dblock::error& cause) override {
    event e{"retried", std::string(op)};
    e.code = cause.kind();
    push(e);
  }
  void released(std::string_view name, std::chrono::microseconds held) override {
    push(event(held.count() < 0 ? "released(negative hold time)" : "released", std::string(name)));
  }
  void renew_failed(std::string_view name, const dblock::error& cause) override {
    event e{"renew_failed", std::string(name)};
    e.code = cause.kind();
    push(e);
  }
  void lost(std::string_view name, dblock::loss_reason why, const dblock::error& cause) override {
    event e{"lease_lost", std::string(name)};
    e.code = cause.kind();
    push(e, std::string(dblock::to_string(why)));
  }
  // The hooks added for metrics: in trace() only (events() and lines() keep the older ones).
  void attached(std::string_view backend) override { note("attached " + std::string(backend)); }
  void acquire_failed(std::string_view name, dblock::acquire_failure why,
                      std::chrono::microseconds waited) override {
    note("acquire_failed " + std::string(name) + " " + std::string(dblock::to_string(why)) +
         (waited.count() < 0 ? " (negative wait)" : ""));
  }
  void waiting(std::string_view name, bool on) override {
    note("waiting " + std::string(name) + (on ? " 1" : " 0"));
  }
  void holding(std::string_view name, bool held) override {
    note("holding " + std::string(name) + (held ? " 1" : " 0"));
  }
  void leadership(std::string_view election, bool leader) override {
    note("leader " + std::string(election) + (leader ? " 1" : " 0"));
  }
  void renew_latency(std::chrono::microseconds latency) override {
    std::lock_guard<std::mutex> lk(mu_);
    ++renew_latencies_;
    if (latency.count() < 0) trace_.push_back("renew_latency (negative)");
  }
  void rows_reaped(std::uint64_t rows, std::uint64_t batches) override {
    event e{"rows_reaped", ""};
    e.rows = rows;
    e.batches = batches;
    push(e);
  }

  std::vector<event> events() const {
    std::lock_guard<std::mutex> lk(mu_);
    return events_;
  }
  // Every event but retries, renewals and renew latencies, in order: the older hooks as
  // lines() shows them (a loss with its reason: "lease_lost NAME REASON"), then the newer ones.
  std::vector<std::string> trace() const {
    std::lock_guard<std::mutex> lk(mu_);
    return trace_;
  }
  std::size_t renew_latencies() const {
    std::lock_guard<std::mutex> lk(mu_);
    return renew_latencies_;
  }

  // One line per event, retries left out (transient noise a scenario cannot script):
  // "acquired NAME fence=F", "contended NAME", "released NAME", "lease_lost NAME",
  // "renew_failed NAME", "rows_reaped=N batches=B".
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    for (const auto& e : events()) {
      if (e.kind == "retried") continue;
      if (e.kind == "acquired")
        out.push_back("acquired " + e.name + " fence=" + std::to_string(e.fence));
      else if (e.kind == "rows_reaped")
        out.push_back("rows_reaped=" + std::to_string(e.rows) +
                      " batches=" + std::to_string(e.batches));
      else
        out.push_back(e.kind + " " + e.name);
    }
    return out;
  }

 private:
  void push(event e, const std::string& reason = std::string()) {
    e.thread = std::this_thread::get_id();
    std::lock_guard<std::mutex> lk(mu_);
    if (e.kind == "acquired")
      trace_.push_back("acquired " + e.name + " fence=" + std::to_string(e.fence));
    else if (e.kind == "rows_reaped")
      trace_.push_back("rows_reaped=" + std::to_string(e.rows));
    else if (e.kind != "retried" && e.kind != "renew_failed")
      trace_.push_back(e.kind + " " + e.name + (reason.empty() ? "" : " " + reason));
    events_.push_back(std::move(e));
  }
  void note(std::string line) {
    std::lock_guard<std::mutex> lk(mu_);
    trace_.push_back(std::move(line));
  }
  mutable std::mutex mu_;
  std::vector<event> events_;
  std::vector<std::string> trace_;
  std::size_t renew_latencies_ = 0;
};

dblock::database open_with(const dblock::test::context& ctx,
                           std::shared_ptr<dblock::listener> events) {
  auto o = ctx.options();
  o.events = std::move(events);
  return ctx.open(o);
}

// The scripted scenario: A acquires X, B tries X (contended), A releases, B acquires X, B's lease
// is force-released, B's renew fails. B's guard is handed back (still armed).
struct scenario {
  std::int64_t first_fence = 0;
  std::int64_t second_fence = 0;
  std::optional<dblock::lease_guard> b_guard;
};

scenario run_scenario(const dblock::database& db, const std::string& x) {
  scenario s;
  lease_lock a(db, x), b(db, x);
  auto ga = a.try_acquire();
  REQUIRE(ga);
  s.first_fence = ga->fence();
  CHECK_FALSE(b.try_acquire());
  ga->release();
  auto gb = b.try_acquire();
  REQUIRE(gb);
  s.second_fence = gb->fence();
  CHECK(s.second_fence == s.first_fence + 1);
  auto fr = dblock::force_release(db, x, "scripted scenario", "admin_test");
  CHECK(fr.previous_fence == s.second_fence);
  CHECK(fr.new_fence == s.second_fence + 1);
  CHECK(fr.was_held);
  CHECK(code_of([&] { gb->renew(); }) == errc::lease_lost);
  s.b_guard = std::move(gb);
  return s;
}

}  // namespace

// ---- list_locks ---------------------------------------------------------------------------------

DBLOCK_TEST("list_locks: held leases only by default; include_free adds released and expired",
            "[admin]") {
  lease_lock held(ctx.db, "ll/held"), released(ctx.db, "ll/released"),
      expired(ctx.db, "ll/expired");
  auto gh = held.try_acquire();
  REQUIRE(gh);
  {
    auto gr = released.try_acquire();
    REQUIRE(gr);
    gr->release();
  }
  auto ge = expired.try_acquire();  // kept: its row stays "held" but past its expiry
  REQUIRE(ge);
  expire_row(ctx, "ll/expired");

  auto only_held = dblock::list_locks(ctx.db);
  CHECK(names_of(only_held) == std::vector<std::string>{"ll/held"});
  REQUIRE(only_held.size() == 1);
  CHECK(only_held[0].held);

  list_options all;
  all.include_free = true;
  auto rows = dblock::list_locks(ctx.db, all);
  CHECK(names_of(rows) == std::vector<std::string>{"ll/expired", "ll/held", "ll/released"});
  const auto* e = find(rows, "ll/expired");
  const auto* r = find(rows, "ll/released");
  REQUIRE(e);
  REQUIRE(r);
  CHECK_FALSE(e->held);
  CHECK(e->hold_count == 1);
  CHECK(e->expires_in < std::chrono::microseconds(0));
  CHECK(e->fence == ge->fence());
  CHECK_FALSE(r->held);
  CHECK(r->hold_count == 0);
  CHECK(r->expires_in <= std::chrono::microseconds(0));
}

DBLOCK_TEST("list_locks: fence, hold count, holder and expiry of a held lease", "[admin]") {
  const milliseconds ttl(20000);
  lease_lock lock(ctx.db, "fields/one", ttl_of(ttl));
  auto g1 = lock.try_acquire();
  REQUIRE(g1);
  auto g2 = lock.try_acquire();  // reentry: same fence, two holds
  REQUIRE(g2);
  auto rows = dblock::list_locks(ctx.db);
  REQUIRE(rows.size() == 1);
  const auto& l = rows[0];
  CHECK(l.name == "fields/one");
  CHECK(l.held);
  CHECK(l.fence == g1->fence());
  CHECK(l.hold_count == 2);
  CHECK(l.owner_token == g1->owner_token());
  CHECK(l.holder_host == this_host());
  CHECK(l.holder_pid == static_cast<std::int64_t>(::getpid()));
  CHECK(l.holder_thread == this_thread_label());
  CHECK(l.expires_in > std::chrono::microseconds(0));
  CHECK(l.expires_in < std::chrono::microseconds(ttl));
  CHECK(l.expires_in > std::chrono::microseconds(ttl - milliseconds(5000)));
  // Times are on the database clock, which on the test servers is this host's clock.
  INFO("acquired_at is " << seconds_from_now(l.acquired_at) << " s from now, expires_at "
                         << seconds_from_now(l.expires_at) << " s");
  CHECK(std::abs(seconds_from_now(l.acquired_at)) <= 60);
  CHECK(l.expires_at > l.acquired_at);
  CHECK(l.expires_at - l.acquired_at <= ttl + milliseconds(5000));

  g2->release();
  rows = dblock::list_locks(ctx.db);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].hold_count == 1);
  g1->release();
  CHECK(dblock::list_locks(ctx.db).empty());
}

DBLOCK_TEST("list_locks: patterns are case-sensitive; %, _, !, [ and \\ in them are literal",
            "[admin]") {
  const std::vector<std::string> names = {"a_b",  "a%b",    "axb",     "a!b",    "A_b",    "a[x]b",
                                          "a\\b", "jobs/1", "jobs/22", "Jobs/3", "jobs/a_"};
  std::vector<dblock::lease_guard> guards;
  std::vector<std::unique_ptr<lease_lock>> locks;
  for (const auto& n : names) {
    locks.push_back(std::make_unique<lease_lock>(ctx.db, n));
    auto g = locks.back()->try_acquire();
    REQUIRE(g);
    guards.push_back(std::move(*g));
  }
  using v = std::vector<std::string>;
  CHECK(matching(ctx.db, "a_b") == v{"a_b"});
  CHECK(matching(ctx.db, "a%b") == v{"a%b"});
  CHECK(matching(ctx.db, "a!b") == v{"a!b"});
  CHECK(matching(ctx.db, "a\\b") == v{"a\\b"});
  CHECK(matching(ctx.db, "a?b") == v{"a!b", "a%b", "a\\b", "a_b", "axb"});
  CHECK(matching(ctx.db, "A?b") == v{"A_b"});
  CHECK(matching(ctx.db, "a_B").empty());
  CHECK(matching(ctx.db, "A*") == v{"A_b"});
  CHECK(matching(ctx.db, "jobs/*") == v{"jobs/1", "jobs/22", "jobs/a_"});
  CHECK(matching(ctx.db, "jobs/?") == v{"jobs/1"});
  CHECK(matching(ctx.db, "jobs/??") == v{"jobs/22", "jobs/a_"});
  CHECK(matching(ctx.db, "jobs/*_") == v{"jobs/a_"});
  CHECK(matching(ctx.db, "JOBS/*").empty());
  CHECK(matching(ctx.db, "*/3") == v{"Jobs/3"});
  CHECK(matching(ctx.db, "*").size() == names.size());
  CHECK(matching(ctx.db, "a").empty());  // a pattern matches whole names
  // Only `*` and `?` are special: brackets are not a character class.
  CHECK(matching(ctx.db, "a[x]b") == v{"a[x]b"});
}

DBLOCK_TEST("list_locks: ? matches one character of a multi-byte UTF-8 name", "[admin]") {
  const std::string cafe = "caf\xc3\xa9";  // "café": 4 characters, 5 bytes
  lease_lock lock(ctx.db, cafe);
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(matching(ctx.db, "caf?") == std::vector<std::string>{cafe});
  CHECK(matching(ctx.db, "caf*") == std::vector<std::string>{cafe});
  CHECK(matching(ctx.db, "caf??").empty());
}

DBLOCK_TEST("list_locks: limit returns the first rows by name and is validated", "[admin]") {
  std::vector<std::unique_ptr<lease_lock>> locks;
  std::vector<dblock::lease_guard> guards;
  for (const char* n : {"lim/e", "lim/b", "lim/d", "lim/a", "lim/c"}) {
    locks.push_back(std::make_unique<lease_lock>(ctx.db, n));
    auto g = locks.back()->try_acquire();
    REQUIRE(g);
    guards.push_back(std::move(*g));
  }
  list_options o;
  o.limit = 2;
  CHECK(names_of(dblock::list_locks(ctx.db, o)) == std::vector<std::string>{"lim/a", "lim/b"});
  o.limit = 1;
  CHECK(names_of(dblock::list_locks(ctx.db, o)) == std::vector<std::string>{"lim/a"});
  o.limit = 100000;
  CHECK(dblock::list_locks(ctx.db, o).size() == 5);
  o.limit = 0;
  CHECK(code_of([&] { (void)dblock::list_locks(ctx.db, o); }) == errc::invalid_argument);
  o.limit = 100001;
  CHECK(code_of([&] { (void)dblock::list_locks(ctx.db, o); }) == errc::invalid_argument);
}

DBLOCK_TEST("admin calls on an unmigrated prefix say schema_missing", "[admin]") {
  auto fresh = ctx.open(dblock::test::with_prefix(ctx.new_prefix()));
  CHECK(code_of([&] { (void)dblock::list_locks(fresh); }) == errc::schema_missing);
  CHECK(code_of([&] { (void)dblock::force_release(fresh, "x", "r", "me"); }) ==
        errc::schema_missing);
  CHECK(code_of([&] { (void)dblock::recent_forced_releases(fresh); }) == errc::schema_missing);
}

// ---- force_release
// --------------------------------------------------------------------------------

DBLOCK_TEST("force_release takes a held lease: fence +1, old holder lease_lost, audited",
            "[admin]") {
  const std::string name = "stuck/job";
  ctx.exec("CREATE TABLE " + ctx.table("counter") + " (id INT PRIMARY KEY, n INT NOT NULL)");
  lease_lock holder(ctx.db, name), fenced_holder(ctx.db, "stuck/fenced");
  auto g = holder.try_acquire();
  REQUIRE(g);
  auto gf = fenced_holder.try_acquire();
  REQUIRE(gf);
  const auto fence = g->fence();

  auto f = dblock::force_release(ctx.db, name, "stuck for 2h", "alice@ops-1");
  CHECK(f.name == name);
  CHECK(f.previous_fence == fence);
  CHECK(f.new_fence == fence + 1);
  CHECK(f.was_held);
  CHECK(f.previous_owner == g->owner_token());
  CHECK(f.previous_holder == this_host() + ":" + std::to_string(::getpid()));
  CHECK(f.forced_by == "alice@ops-1");
  CHECK(f.reason == "stuck for 2h");
  CHECK(std::abs(seconds_from_now(f.at)) <= 60);

  // The row: free, fence bumped, owner token replaced.
  list_options all;
  all.include_free = true;
  all.pattern = name;
  auto rows = dblock::list_locks(ctx.db, all);
  REQUIRE(rows.size() == 1);
  CHECK_FALSE(rows[0].held);
  CHECK(rows[0].hold_count == 0);
  CHECK(rows[0].fence == fence + 1);
  CHECK(rows[0].owner_token != g->owner_token());
  CHECK(rows[0].owner_token.size() == 32);
  CHECK(matching(ctx.db, name).empty());

  // The old holder: renew, fenced writes and release all report lease_lost; nothing is written.
  CHECK(code_of([&] { g->renew(); }) == errc::lease_lost);
  bool ran = false;
  auto write = [&](soci::session& sql) {
    ran = true;
    sql << "INSERT INTO " << ctx.table("counter") << " (id, n) VALUES (1, 1)";
  };
  CHECK(code_of([&] { g->fenced(write); }) == errc::lease_lost);
  CHECK(code_of([&] { g->release(); }) == errc::lease_lost);
  // A second holder whose first call after the forced release is the fenced write.
  (void)dblock::force_release(ctx.db, "stuck/fenced", "fenced path", "alice@ops-1");
  CHECK(code_of([&] { gf->fenced(write); }) == errc::lease_lost);
  CHECK_FALSE(ran);
  {
    auto c = ctx.db.connect();
    int n = -1;
    c.session() << "SELECT count(*) FROM " << ctx.table("counter"), soci::into(n);
    CHECK(n == 0);
  }

  // A new acquisition gets a fence above the forced one.
  lease_lock next(ctx.db, name);
  auto gn = next.try_acquire();
  REQUIRE(gn);
  CHECK(gn->fence() > fence);
  CHECK(gn->fence() >= f.new_fence + 1);

  // The audit trail, newest first.
  auto audit = dblock::recent_forced_releases(ctx.db);
  REQUIRE(audit.size() == 2);
  CHECK(audit[0].name == "stuck/fenced");
  const auto& a = audit[1];
  CHECK(a.name == name);
  CHECK(a.previous_fence == fence);
  CHECK(a.new_fence == fence + 1);
  CHECK(a.previous_owner == f.previous_owner);
  CHECK(a.previous_holder == f.previous_holder);
  CHECK(a.was_held);
  CHECK(a.forced_by == "alice@ops-1");
  CHECK(a.reason == "stuck for 2h");
  CHECK(std::abs(std::chrono::duration_cast<milliseconds>(a.at - f.at).count()) < 1000);
  CHECK(audit[0].at >= a.at);
}

DBLOCK_TEST("force_release of a free or expired lease: was_held false, fences keep growing",
            "[admin]") {
  lease_lock lock(ctx.db, "free/x"), other(ctx.db, "expired/y");
  std::int64_t fence = 0;
  {
    auto g = lock.try_acquire();
    REQUIRE(g);
    fence = g->fence();
    g->release();
  }
  auto f1 = dblock::force_release(ctx.db, "free/x", "cleanup", "bob");
  CHECK_FALSE(f1.was_held);
  CHECK(f1.previous_fence == fence);
  CHECK(f1.new_fence == fence + 1);
  auto f2 = dblock::force_release(ctx.db, "free/x", "again", "bob");
  CHECK_FALSE(f2.was_held);
  CHECK(f2.previous_fence == fence + 1);
  CHECK(f2.new_fence == fence + 2);
  CHECK(f2.previous_owner != f1.previous_owner);  // each forced release sets a new token
  CHECK(f2.previous_owner.size() == 32);

  auto gy = other.try_acquire();
  REQUIRE(gy);
  expire_row(ctx, "expired/y");
  auto f3 = dblock::force_release(ctx.db, "expired/y", "expired holder", "bob");
  CHECK_FALSE(f3.was_held);
  CHECK(f3.previous_fence == gy->fence());

  auto audit = dblock::recent_forced_releases(ctx.db, 5);
  REQUIRE(audit.size() == 3);
  CHECK(audit[0].name == "expired/y");
  CHECK(audit[1].new_fence == fence + 2);
  CHECK(audit[1].reason == "again");
  CHECK(audit[2].new_fence == fence + 1);
  CHECK(audit[2].reason == "cleanup");
  CHECK(dblock::recent_forced_releases(ctx.db, 1).size() == 1);
  CHECK(code_of([&] { (void)dblock::recent_forced_releases(ctx.db, 0); }) ==
        errc::invalid_argument);

  // The lock still works, above every forced fence.
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(g->fence() >= fence + 3);
}

DBLOCK_TEST("force_release: missing name is not_found, oversized reason invalid_argument",
            "[admin]") {
  CHECK(code_of([&] { (void)dblock::force_release(ctx.db, "no/such", "r", "me"); }) ==
        errc::not_found);
  CHECK(code_of([&] { (void)dblock::force_release(ctx.db, "", "r", "me"); }) ==
        errc::invalid_argument);
  lease_lock lock(ctx.db, "big/reason");
  auto g = lock.try_acquire();
  REQUIRE(g);
  CHECK(code_of([&] {
          (void)dblock::force_release(ctx.db, "big/reason", std::string(1001, 'r'), "me");
        }) == errc::invalid_argument);
  CHECK(code_of([&] {
          (void)dblock::force_release(ctx.db, "big/reason", "r", std::string(256, 'w'));
        }) == errc::invalid_argument);
  // Nothing was forced or recorded by the failed calls.
  CHECK(dblock::recent_forced_releases(ctx.db).empty());
  CHECK_NOTHROW(g->renew());
  // 1000 bytes is allowed, also as 500 two-byte characters.
  std::string reason;
  for (int i = 0; i < 500; ++i)
    reason += "\xc3\xa9";
  auto f = dblock::force_release(ctx.db, "big/reason", reason, std::string(255, 'w'));
  CHECK(f.was_held);
  auto audit = dblock::recent_forced_releases(ctx.db);
  REQUIRE(audit.size() == 1);
  CHECK(audit[0].reason == reason);
  CHECK(audit[0].forced_by == std::string(255, 'w'));
}

// ---- listener
// -------------------------------------------------------------------------------------

DBLOCK_TEST("listener: acquire, contention, release and a forced release, in order", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  const std::string x = "events/x";
  auto s = run_scenario(db, x);
  const std::vector<std::string> expected = {
      "acquired events/x fence=" + std::to_string(s.first_fence),
      "contended events/x",
      "released events/x",
      "acquired events/x fence=" + std::to_string(s.first_fence + 1),
      "lease_lost events/x",
  };
  CHECK(rec->lines() == expected);
  auto ev = rec->events();
  REQUIRE(!ev.empty());
  CHECK(ev.back().code == errc::lease_lost);
  for (const auto& e : ev)
    CHECK(e.thread == std::this_thread::get_id());  // synchronous, on the caller's thread

  // Releasing the lost lease fails; it released nothing, so no "released" event may follow
  // (and the loss is not reported twice).
  CHECK(code_of([&] { s.b_guard->release(); }) == errc::lease_lost);
  CHECK(rec->lines() == expected);
}

DBLOCK_TEST("listener: reentrant holds report one acquired and one released each", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  lease_lock lock(db, "events/re");
  auto g1 = lock.try_acquire();
  REQUIRE(g1);
  auto g2 = lock.try_acquire();
  REQUIRE(g2);
  const std::string f = std::to_string(g1->fence());
  g2->release();
  g1->release();
  CHECK(rec->lines() == std::vector<std::string>{"acquired events/re fence=" + f,
                                                 "acquired events/re fence=" + f,
                                                 "released events/re", "released events/re"});
}

DBLOCK_TEST("listener: the watchdog reports a forced release as lease_lost", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  const std::string x = "events/watchdog";
  std::promise<std::size_t> lost;  // how many events the listener had when on_lost ran
  auto lost_future = lost.get_future();
  lease_options o = ttl_of(milliseconds(2000));  // renewed about every 670 ms
  o.watchdog = true;
  o.on_lost = [&](const dblock::error&) { lost.set_value(rec->events().size()); };
  lease_lock lock(db, x, o);
  auto g = lock.try_acquire();
  REQUIRE(g);
  std::this_thread::sleep_for(milliseconds(800));  // past a renewal (a slack of a second)
  REQUIRE(g->valid());
  (void)dblock::force_release(db, x, "watchdog test", "admin_test");
  // The next renewal finds the lease gone (within 670 ms; more on a busy machine).
  REQUIRE(lost_future.wait_for(milliseconds(10000)) == std::future_status::ready);
  CHECK(lost_future.get() == 2);  // the listener heard of the loss before on_lost ran
  CHECK(rec->lines() ==
        std::vector<std::string>{"acquired " + x + " fence=" + std::to_string(g->fence()),
                                 "lease_lost " + x});
  auto ev = rec->events();
  REQUIRE(ev.size() == 2);
  CHECK(ev[1].code == errc::lease_lost);
  CHECK(ev[1].thread != std::this_thread::get_id());  // reported from the watchdog thread
  CHECK_FALSE(g->valid());
}

DBLOCK_TEST("listener: one contended per call, waits paired, failures and holds", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  const std::string x = "metrics/x";
  lease_options fast;
  fast.poll_initial = milliseconds(1);
  fast.poll_max = milliseconds(10);  // dozens of polls in 300 ms: each must not count
  lease_lock a(db, x), b(db, x, fast);
  auto ga = a.try_acquire();
  REQUIRE(ga);
  const std::string f1 = std::to_string(ga->fence());
  CHECK(code_of([&] { (void)b.acquire(milliseconds(300)); }) == errc::timeout);
  dblock::cancellation cancel;
  auto waiter = std::async(std::launch::async, [&] {
    return code_of([&] { (void)b.acquire(std::chrono::seconds(30), cancel); });
  });
  std::this_thread::sleep_for(milliseconds(200));
  cancel.cancel();
  CHECK(waiter.get() == errc::cancelled);
  CHECK_FALSE(b.try_acquire());
  ga->release();
  auto gb = b.acquire(milliseconds(1000));  // free: no contention, no wait
  const std::string f2 = std::to_string(gb.fence());
  gb.release();
  CHECK(rec->trace() == std::vector<std::string>{
                            "attached " + ctx.backend,
                            "acquired " + x + " fence=" + f1,
                            "holding " + x + " 1",
                            "contended " + x,
                            "waiting " + x + " 1",
                            "acquire_failed " + x + " timeout",
                            "waiting " + x + " 0",
                            "contended " + x,
                            "waiting " + x + " 1",
                            "acquire_failed " + x + " cancelled",
                            "waiting " + x + " 0",
                            "contended " + x,
                            "released " + x,
                            "holding " + x + " 0",
                            "acquired " + x + " fence=" + f2,
                            "holding " + x + " 1",
                            "released " + x,
                            "holding " + x + " 0",
                        });
}

DBLOCK_TEST("listener: a semaphore's call is contended once, however many permits it tried",
            "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  dblock::semaphore s1(db, "metrics/sem", 3), s2(db, "metrics/sem", 3);
  std::vector<dblock::lease_guard> held;
  for (int k = 0; k < 3; ++k) {
    auto g = s1.try_acquire();
    REQUIRE(g);
    held.push_back(std::move(*g));
  }
  const auto before = rec->trace().size();
  CHECK_FALSE(s2.try_acquire());  // every permit tried or read: one call
  CHECK(code_of([&] { (void)s2.acquire(milliseconds(200)); }) == errc::timeout);
  const auto t = rec->trace();
  CHECK(std::vector<std::string>(t.begin() + static_cast<long>(before), t.end()) ==
        std::vector<std::string>{"contended metrics/sem", "contended metrics/sem",
                                 "waiting metrics/sem 1", "acquire_failed metrics/sem timeout",
                                 "waiting metrics/sem 0"});
  held.clear();
  long holds = 0;
  for (const auto& line : rec->trace())
    holds += line.rfind("holding ", 0) == 0 ? (line.back() == '1' ? 1 : -1) : 0;
  CHECK(holds == 0);  // three permits held and released: the gauge is back at zero
}

DBLOCK_TEST("listener: a lost lease says why: forced, taken over, expired, connection", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  auto lost_of = [&](const std::string& name) {
    std::vector<std::string> out;
    for (const auto& line : rec->trace())
      if (line.rfind("lease_lost " + name + " ", 0) == 0) out.push_back(line);
    return out;
  };
  // Forced: an operator took it.
  lease_lock fl(db, "why/forced");
  auto gf = fl.try_acquire();
  REQUIRE(gf);
  (void)dblock::force_release(db, "why/forced", "test", "admin_test");
  CHECK(code_of([&] { gf->renew(); }) == errc::lease_lost);
  CHECK(lost_of("why/forced") == std::vector<std::string>{"lease_lost why/forced forced"});
  // Taken over: it expired and another owner holds it now.
  lease_lock t1(db, "why/taken"), t2(db, "why/taken");
  auto gt = t1.try_acquire();
  REQUIRE(gt);
  expire_row(ctx, "why/taken");
  auto gt2 = t2.try_acquire();
  REQUIRE(gt2);
  CHECK(code_of([&] { gt->fenced([](soci::session&) {}); }) == errc::lease_lost);
  CHECK(lost_of("why/taken") == std::vector<std::string>{"lease_lost why/taken taken_over"});
  // Expired: still its row, past its expiry.
  lease_lock el(db, "why/expired");
  auto ge = el.try_acquire();
  REQUIRE(ge);
  expire_row(ctx, "why/expired");
  CHECK(code_of([&] { ge->release(); }) == errc::lease_lost);
  CHECK(lost_of("why/expired") == std::vector<std::string>{"lease_lost why/expired expired"});
  // Connection: the watchdog's renewal hangs (another transaction locks the row; SQLite: the
  // database) until the local validity runs out.
  lease_options o = ttl_of(milliseconds(1000));
  o.watchdog = true;
  std::promise<void> gone;
  o.on_lost = [&](const dblock::error&) { gone.set_value(); };
  lease_lock cl(db, "why/connection", o);
  auto gc = cl.try_acquire();
  REQUIRE(gc);
  {
    dblock::transaction blocker(ctx.db);
    REQUIRE(blocker.lock_resource("why/connection"));
    REQUIRE(gone.get_future().wait_for(milliseconds(3000)) == std::future_status::ready);
  }
  CHECK(lost_of("why/connection") ==
        std::vector<std::string>{"lease_lost why/connection connection"});
  // Every hold ended: each loss closed its hold once.
  long holds = 0;
  for (const auto& line : rec->trace())
    holds += line.rfind("holding ", 0) == 0 ? (line.back() == '1' ? 1 : -1) : 0;
  CHECK(holds == 1);  // gt2 only
  gt2->release();
}

DBLOCK_TEST("listener: leadership is reported when won and when resigned", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  dblock::election e(db, "metrics/election", "me");
  auto l = e.try_campaign();
  REQUIRE(l);
  l->resign();
  std::vector<std::string> leader;
  for (const auto& line : rec->trace())
    if (line.rfind("leader ", 0) == 0) leader.push_back(line);
  CHECK(leader ==
        std::vector<std::string>{"leader metrics/election 1", "leader metrics/election 0"});
}

DBLOCK_TEST("listener: reap_once reports rows_reaped per batch with the right counts", "[admin]") {
  auto rec = std::make_shared<recorder>();
  auto db = open_with(ctx, rec);
  for (const char* n : {"reap/a", "reap/b", "reap/c"}) {
    lease_lock l(db, n);
    auto g = l.try_acquire();
    REQUIRE(g);
    g->release();
  }
  lease_lock keep(db, "reap/held");
  auto gk = keep.try_acquire();
  REQUIRE(gk);
  auto before = rec->events().size();

  dblock::reaper_options o;
  o.retention = milliseconds(0);
  o.floor_grace = milliseconds(0);
  o.batch_size = 2;
  auto r = dblock::reap_once(db, o);
  CHECK(r.rows_reaped == 3);
  CHECK(r.batches == 2);
  auto lines = rec->lines();
  REQUIRE(lines.size() >= before);
  CHECK(std::vector<std::string>(lines.begin() + static_cast<long>(before), lines.end()) ==
        std::vector<std::string>{"rows_reaped=2 batches=1", "rows_reaped=1 batches=1"});
  list_options all;
  all.include_free = true;
  CHECK(names_of(dblock::list_locks(db, all)) == std::vector<std::string>{"reap/held"});
}

// ---- prometheus
// -----------------------------------------------------------------------------------

#ifdef DBLOCK_TEST_PROMETHEUS
namespace {

// The value of one sample line `metric{labels} value` of the text format, or -1 when absent.
double sample(const std::string& text, const std::string& metric, const std::string& labels) {
  std::istringstream in(text);
  std::string line;
  const std::string head = metric + "{" + labels + "} ";
  while (std::getline(in, line))
    if (line.compare(0, head.size(), head) == 0) return std::stod(line.substr(head.size()));
  return -1;
}

}  // namespace

DBLOCK_TEST("prometheus_listener: exact values of a scripted run, backend label filled in",
            "[admin]") {
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics = std::make_shared<dblock::prometheus_listener>(registry);  // no label given
  auto db = open_with(ctx, metrics);
  CHECK(metrics->backend_label() == ctx.backend);
  // Acquired 2, contended 1, released 1 (held ~0 s), lost 1 (forced: its renew fails, one
  // renewal timed). B's lost guard stays armed until the end.
  auto s = run_scenario(db, "prom/x");
  dblock::reaper_options o;
  o.retention = milliseconds(0);
  o.floor_grace = milliseconds(0);
  CHECK(dblock::reap_once(db, o).rows_reaped == 1);  // the force-released row
  // Held on: acquired 3; a wait for it times out (contended 2, one timeout); one renewal more.
  lease_lock c(db, "prom/y"), d(db, "prom/y");
  auto gc = c.try_acquire();
  REQUIRE(gc);
  CHECK(code_of([&] { (void)d.acquire(milliseconds(100)); }) == errc::timeout);
  gc->renew();
  // A leadership: acquired 4, held 2, the leader gauge 1.
  dblock::election e(db, "prom/e", "me");
  auto leader = e.try_campaign();
  REQUIRE(leader);

  std::string text = metrics->text();
  INFO(text);
  const std::string b = "backend=\"" + ctx.backend + "\"";
  CHECK(text.find("# TYPE dblock_acquired_total counter") != std::string::npos);
  CHECK(sample(text, "dblock_acquired_total", b) == 4);
  CHECK(sample(text, "dblock_contended_total", b) == 2);
  CHECK(sample(text, "dblock_acquire_failures_total", b + ",reason=\"timeout\"") == 1);
  CHECK(sample(text, "dblock_acquire_failures_total", b + ",reason=\"cancelled\"") == 0);
  CHECK(sample(text, "dblock_acquire_failures_total", b + ",reason=\"error\"") == 0);
  CHECK(sample(text, "dblock_released_total", b) == 1);
  CHECK(sample(text, "dblock_hold_seconds_count", b) == 1);
  CHECK(sample(text, "dblock_hold_seconds_bucket", b + ",le=\"600\"") == 1);
  CHECK(sample(text, "dblock_leases_lost_total", b + ",reason=\"forced\"") == 1);
  CHECK(sample(text, "dblock_leases_lost_total", b + ",reason=\"expired\"") == 0);
  CHECK(sample(text, "dblock_leases_lost_total", b + ",reason=\"taken_over\"") == 0);
  CHECK(sample(text, "dblock_leases_lost_total", b + ",reason=\"connection\"") == 0);
  CHECK(sample(text, "dblock_retries_total", b) >= 0);
  CHECK(sample(text, "dblock_renew_failures_total", b) == 0);
  CHECK(sample(text, "dblock_renew_seconds_count", b) == 2);
  CHECK(sample(text, "dblock_rows_reaped_total", b) == 1);
  CHECK(sample(text, "dblock_leases_held", b) == 2);
  CHECK(sample(text, "dblock_acquires_waiting", b) == 0);
  CHECK(sample(text, "dblock_leader", b + ",election=\"prom/e\"") == 1);
  CHECK(text.find("# TYPE dblock_acquire_seconds histogram") != std::string::npos);
  CHECK(sample(text, "dblock_acquire_seconds_count", b) == 4);
  CHECK(sample(text, "dblock_acquire_seconds_bucket", b + ",le=\"+Inf\"") == 4);
  CHECK(sample(text, "dblock_acquire_seconds_bucket", b + ",le=\"600\"") == 4);
  const double sum = sample(text, "dblock_acquire_seconds_sum", b);
  CHECK(sum > 0);
  CHECK(sum < 10);

  // Resigned and released: the gauges go back.
  leader->resign();
  gc->release();
  text = metrics->text();
  CHECK(sample(text, "dblock_leader", b + ",election=\"prom/e\"") == 0);
  CHECK(sample(text, "dblock_leases_held", b) == 0);
  CHECK(sample(text, "dblock_released_total", b) == 3);
}
#endif
