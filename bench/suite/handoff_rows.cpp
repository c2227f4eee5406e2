// The handoff rows: K = clients - 1 waiters on one lock, the latency from a release to the next
// holder's return from acquire(), and what the handoffs cost (wake-ups, fairness); through dblock
// (own handles, one shared handle, fair, PostgreSQL's fast mode) and raw LISTEN/NOTIFY.
#include <libpq-fe.h>
#include <sys/select.h>
#include <dblock/dblock.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "rows.hpp"

namespace dblock::bench {
namespace {

// A releaser stays out of the race until another thread has taken the lock (at most 2 s, and not
// past the end of the measurement, when the others stop taking it), so that every measured
// handoff goes to a waiter, not back to the releaser. It sleeps on a condition variable: a
// releaser that polled would take CPU from the very handoff it measures on a small machine
// (polling every 50 us cost about 10 wake-ups per handoff).
class turns {
 public:
  /// A new holder took the lock, or a holder starts its release: the number of that event.
  long long next() {
    std::lock_guard<std::mutex> l(mu_);
    ++generation_;
    cv_.notify_all();
    return generation_;
  }
  /// Waits until another event than `released` (the caller's release) happened.
  void wait_for_successor(long long released) {
    const auto give_up = std::min(clk::now() + std::chrono::seconds(2), measurement_end);
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_until(l, give_up, [&] { return generation_ != released; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  long long generation_ = 0;
};

// Each handoff row also checks what it measures: one holder at a time, and every grant's fence
// above the one before. A violation fails that cycle (an error of the row, the fences in its
// note); the holder leaves before its release starts, so a successor never overlaps it.
class exclusion_check {
 public:
  /// Empty, or what was broken.
  std::string enter(std::int64_t fence) {
    std::lock_guard<std::mutex> l(mu_);
    std::string broken;
    if (holders_++ > 0)
      broken = "two holders at once: fence " + std::to_string(fence) + " granted while fence " +
               std::to_string(held_) + " was held";
    else if (fence <= last_)
      broken = "fence " + std::to_string(fence) + " granted after fence " + std::to_string(last_);
    held_ = fence;
    last_ = std::max(last_, fence);
    return broken;
  }
  void leave() {
    std::lock_guard<std::mutex> l(mu_);
    --holders_;
  }

 private:
  std::mutex mu_;
  int holders_ = 0;
  std::int64_t held_ = 0, last_ = 0;
};

// Counts the wake-ups of waiting acquires (listener::woken) within the measurement window.
struct wake_counter : dblock::listener {
  std::atomic<long long> n{0};
  std::atomic<clk::rep> from{clk::time_point::max().time_since_epoch().count()},
      to{clk::time_point::max().time_since_epoch().count()};
  void window(clk::time_point start, clk::time_point end) {
    from = start.time_since_epoch().count();
    to = end.time_since_epoch().count();
  }
  void woken(std::string_view) override {
    const auto now = clk::now().time_since_epoch().count();
    if (now >= from.load() && now < to.load()) ++n;
  }
};

// The fairness figures of a handoff row from its counted acquire() waits (µs) and the grants to
// other clients during each: the longest wait over the mean one, in time and in turns.
void add_fairness(result& r, const std::vector<float>& waits,
                  const std::vector<long long>& waited_turns) {
  double sum = 0, top = 0;
  for (float w : waits) {
    sum += w;
    top = std::max<double>(top, w);
  }
  r.wait_mean_us = sum / waits.size();
  r.wait_max_us = top;
  if (sum > 0) r.fairness = top / (sum / waits.size());
  // The 99th percentile over the mean: the same without the one worst hiccup of the machine.
  std::vector<float> sorted = waits;
  if (sum > 0) r.figures["wait_p99_over_mean"] = percentile(sorted, 0.99) / (sum / waits.size());
  // The same in turns, which machine hiccups do not lengthen: how many grants went to other
  // clients during a wait (in queue order with K waiters, K - 1 every time).
  long long turns_sum = 0, turns_top = 0;
  for (long long t : waited_turns) {
    turns_sum += t;
    turns_top = std::max(turns_top, t);
  }
  const double turns_mean = static_cast<double>(turns_sum) / waited_turns.size();
  r.figures["turns_mean"] = turns_mean;
  r.figures["turns_max"] = static_cast<double>(turns_top);
  if (turns_mean > 0) r.figures["fairness_max_over_mean_turns"] = turns_top / turns_mean;
}

// The fairness figures for a row's note: the longest wait over the mean one in time and in turns,
// and the longest hold (a hold that oversleeps on a busy machine lengthens every wait behind it).
std::string fairness_note(const result& r) {
  auto figure = [&](const char* k) {
    const auto it = r.figures.find(k);
    return it == r.figures.end() ? 0.0 : it->second;
  };
  char text[160];
  std::snprintf(text, sizeof text,
                "; max/mean wait %.2f (in turns %.2f; p99/mean %.2f); longest hold %.1f ms",
                r.fairness.value_or(0), figure("fairness_max_over_mean_turns"),
                figure("wait_p99_over_mean"), figure("hold_max_us") / 1000.0);
  return text;
}

// K = clients - 1 waiters on one lock. Each holder keeps it hold_us, notes when it starts
// release(), and the next holder measures from that instant to the return of its acquire().
// With `own_handles` every client opens its own database handle, as separate processes would:
// a release then reaches the waiters only through the database (PostgreSQL NOTIFY), the
// doorbell (SQLite) or the interrupted sleep of their wake-up connection (MySQL); otherwise all
// share the bench's handle and are woken within the process. Only handoffs, waits, holds,
// releases and wake-ups within the measurement window count: in the warm-up, the handles
// connect and their wake-up connections start, and waiters poll until those are in place.
// What a handoff row hands over: a lease, the one permit of a semaphore, or a read-write lock's
// writer side (each waits through the one waiting engine: the lease's queue, the semaphore's).
enum class handed { lease, session_lease, permit, writer };

// The acquire(30 s) of one client's lock of that kind.
std::function<dblock::lease_guard()> handoff_lock(handed kind, const dblock::database& db,
                                                  const dblock::lease_options& lo) {
  const auto wait = std::chrono::seconds(30);
  switch (kind) {
    case handed::permit: {
      auto s = std::make_shared<dblock::semaphore>(db, "bench/handoff_permit", 1, lo);
      return [s, wait] { return s->acquire(wait); };
    }
    case handed::writer: {
      auto rw = std::make_shared<dblock::rwlock>(db, "bench/handoff_rwlock", lo);
      return [rw, wait] { return rw->acquire(wait); };
    }
    case handed::session_lease: {
      // A name used in session mode stays in it (its row is the session mode's marker): the
      // session rows hand over a name of their own.
      auto lk = std::make_shared<dblock::lease_lock>(db, "bench/handoff_session", lo,
                                                     dblock::lease_mode::session);
      return [lk, wait] { return lk->acquire(wait); };
    }
    case handed::lease:
      break;
  }
  auto lk = std::make_shared<dblock::lease_lock>(db, "bench/handoff", lo);
  return [lk, wait] { return lk->acquire(wait); };
}

result handoff_dblock(backend_ctx& b, int clients, double seconds, int hold_us, bool own_handles,
                      const dblock::lease_options& lo, handed kind = handed::lease) {
  std::atomic<long long> release_started{0}, releases{0};
  std::atomic<long long> grants{0};  // acquires so far, for the turns a wait lasted
  turns turn;
  exclusion_check exclusion;
  std::mutex mu;
  std::vector<float> lat, waits;
  std::vector<long long> waited_turns;  // grants to other clients during each counted wait
  double held_ns = 0;      // how long holders really kept the lock (sleep_for() oversleeps)
  double held_max_ns = 0;  // the longest hold: what a wait's longest time owes the machine
  long long holds = 0;
  auto now_ns = [] { return clk::now().time_since_epoch().count(); };
  auto counter = std::make_shared<wake_counter>();
  // On the measuring thread: within its window (not in the warm-up, not after the end).
  auto in_window = [](long long t) {
    return t >= measurement_start.time_since_epoch().count() &&
           t < measurement_end.time_since_epoch().count();
  };
  // Waits for the fairness figure: asked in the window but not in its last fifth. A wait asked
  // later can end after the window, while the clients leave and close their handles (no longer
  // the constant contention that figure is about); leaving out the waits that end after the
  // window instead would leave out only the long ones of those asked near its end.
  auto before_last_fifth = [](long long t) {
    const long long s = measurement_start.time_since_epoch().count();
    const long long e = measurement_end.time_since_epoch().count();
    return t >= s && t < e - (e - s) / 5;
  };
  auto o = b.db.options();
  o.events = counter;
  o.pool_size = own_handles ? 2 : std::max<std::size_t>(o.pool_size, clients + 2);
  dblock::database shared(b.url, o);
  auto r = measure(clients, seconds, [&](int) {
    auto acquire = handoff_lock(kind, own_handles ? dblock::database(b.url, o) : shared, lo);
    auto cycles = std::make_shared<int>(0);
    return cycle_fn([&, acquire, cycles] {
      counter->window(measurement_start, measurement_end);  // set once the threads start
      const long long asked = now_ns(), grants_before = grants.load();
      auto g = acquire();
      const long long got = now_ns(), rel = release_started.exchange(0);
      const long long overtaken = grants.fetch_add(1) - grants_before;
      const std::string broken = exclusion.enter(g.fence());
      turn.next();
      const bool counted = in_window(asked);
      {
        std::lock_guard<std::mutex> l(mu);
        if (rel && in_window(rel)) lat.push_back(static_cast<float>((got - rel) / 1000.0));
        // The first waits of a client include connecting its handle and joining the race.
        if (++*cycles > 2 && counted && before_last_fifth(asked)) {
          waits.push_back(static_cast<float>((got - asked) / 1000.0));
          waited_turns.push_back(overtaken);
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
      const long long gen = turn.next();
      exclusion.leave();
      const long long start = now_ns();
      release_started = start;
      if (counted) {
        std::lock_guard<std::mutex> l(mu);
        held_ns += static_cast<double>(start - got);
        held_max_ns = std::max(held_max_ns, static_cast<double>(start - got));
        ++holds;
      }
      g.release();
      if (in_window(start)) ++releases;
      turn.wait_for_successor(gen);
      if (!broken.empty()) throw std::runtime_error(broken);
      return true;
    });
  });
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  if (releases.load() > 0)
    r.woken_per_release = static_cast<double>(counter->n.load()) / releases.load();
  if (holds > 0) {
    r.figures["hold_mean_us"] = held_ns / static_cast<double>(holds) / 1000.0;
    r.figures["hold_max_us"] = held_max_ns / 1000.0;
  }
  if (!waits.empty()) add_fairness(r, waits, waited_turns);
  return r;
}

// The same with PostgreSQL LISTEN/NOTIFY: a waiter sleeps until the holder's release notifies
// it (or 100 ms pass), instead of polling. Raw libpq, the lease statements of dblock.
result handoff_notify(backend_ctx& b, int clients, double seconds, int hold_us) {
  std::atomic<long long> release_started{0};
  turns turn;
  std::mutex mu;
  std::vector<float> lat;
  auto now_ns = [] { return clk::now().time_since_epoch().count(); };
  auto r = measure(clients, seconds, [&](int) {
    auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
    c->exec("LISTEN dblock_bench_handoff");
    return cycle_fn([&, c] {
      auto* conn = static_cast<PGconn*>(c->handle());
      for (;;) {
        const std::string tok = token();
        auto f = raw_acquire(*c, b, "bench/handoff_notify", tok);
        if (f) {
          const long long got = now_ns(), rel = release_started.exchange(0);
          turn.next();
          if (rel && rel >= measurement_start.time_since_epoch().count() &&
              rel < measurement_end.time_since_epoch().count()) {
            std::lock_guard<std::mutex> l(mu);
            lat.push_back(static_cast<float>((got - rel) / 1000.0));
          }
          std::this_thread::sleep_for(std::chrono::microseconds(hold_us));
          const long long gen = turn.next();
          release_started = now_ns();
          raw_release(*c, b, "bench/handoff_notify", tok, *f);
          c->exec("NOTIFY dblock_bench_handoff");
          turn.wait_for_successor(gen);
          return true;
        }
        // Wait for a notification (or 100 ms), then drain them all and try again.
        while (PGnotify* n = PQnotifies(conn))
          PQfreemem(n);
        fd_set fds;
        FD_ZERO(&fds);
        FD_SET(PQsocket(conn), &fds);
        timeval tv{0, 100000};
        select(PQsocket(conn) + 1, &fds, nullptr, nullptr, &tv);
        PQconsumeInput(conn);
        while (PGnotify* n = PQnotifies(conn))
          PQfreemem(n);
      }
    });
  });
  r.p50_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

}  // namespace

std::vector<row> handoff_rows(backend_ctx& b, const options& o) {
  const double seconds = o.seconds;
  const int hold_us = o.hold_us;
  const std::string hold = "; hold " + std::to_string(hold_us) + " us";
  std::vector<row> ops;
  // Through dblock: every client its own database handle (as processes) or one shared handle,
  // and fair.
  auto add = [&](const char* name, bool own, bool fair, handed kind = handed::lease) {
    const std::string what = kind == handed::permit   ? "the one permit of a semaphore; "
                             : kind == handed::writer ? "a read-write lock's writer side; "
                                                      : "";
    const std::string note = what +
                             (own ? "one database handle per client (as processes)"
                                  : "one database handle shared by the clients") +
                             (fair ? (o.no_handover ? ", fair, no handover" : ", fair") : "") +
                             "; K=clients-1 waiters; latency from release() start to the next "
                             "acquire() return (p50/p99); ops/s = handoffs/s" +
                             hold;
    ops.push_back(make_row(
        name, "handoff", kind == handed::lease ? "" : "dblock.handoff", note, schedule::contended,
        [seconds, hold_us, own, fair, kind](backend_ctx* b, int clients, std::ostream&) {
          auto lo = b->wait_options;
          lo.fair = fair;
          result r = handoff_dblock(*b, clients, seconds, hold_us, own, lo, kind);
          char extra[96];
          std::snprintf(extra, sizeof extra, "; woken per release %.2f",
                        r.woken_per_release.value_or(0));
          r.note = extra + fairness_note(r);
          return r;
        }));
  };
  add("dblock.handoff", true, false);
  add("dblock.handoff_shared", false, false);
  add("dblock.handoff_fair", true, true);
  add("dblock.semaphore_handoff", true, false, handed::permit);
  add("dblock.rwlock_handoff", true, false, handed::writer);
  // The same across handles on PostgreSQL's fast lease table: the wake-up path without the two
  // commits' WAL flushes.
  if (b.fast)
    ops.push_back(make_row(
        "dblock.handoff_fast", "handoff", "",
        "as dblock.handoff on the fast lease table (UNLOGGED, docs/fast-leases.md): the wake-up "
        "path without the WAL flushes of the release and the acquire" +
            hold,
        schedule::contended, [seconds, hold_us](backend_ctx* b, int clients, std::ostream&) {
          return handoff_dblock(*b->fast, clients, seconds, hold_us, true, b->wait_options);
        }));
  // Session leases (docs/session-leases.md): the waiters queue in the server's own lock queue,
  // which hands the lock over at the release. A session lock needs a session of its own.
  if (b.session_leases)
    ops.push_back(make_row(
        "dblock.handoff_session", "handoff", "dblock.handoff",
        "lease_lock in lease_mode::session: waiters in the server's lock queue (FIFO); one "
        "database handle per "
        "client; K=clients-1 waiters; latency from release() start to the next acquire() return "
        "(p50/p99); ops/s = handoffs/s" +
            hold,
        schedule::contended, [seconds, hold_us](backend_ctx* b, int clients, std::ostream&) {
          result r = handoff_dblock(*b, clients, seconds, hold_us, true, b->wait_options,
                                    handed::session_lease);
          r.note = fairness_note(r);
          return r;
        }));
  // LISTEN needs a session of its own.
  if (b.backend == "postgresql" && b.db.options().pooler != dblock::pooler_mode::transaction)
    ops.push_back(make_row("pg.notify_handoff", "handoff", "",
                           "raw libpq: waiters LISTEN and retry on NOTIFY from the releaser",
                           schedule::contended,
                           [seconds, hold_us](backend_ctx* b, int clients, std::ostream&) {
                             return handoff_notify(*b, clients, seconds, hold_us);
                           }));
  return ops;
}

}  // namespace dblock::bench
