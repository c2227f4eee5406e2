#include "dblock/reaper.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "dblock/retry.hpp"
#include "storage/lock_table.hpp"
#include "storage/wait_queue.hpp"
#include "storage/write_scope.hpp"

namespace dblock {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using clock_type = std::chrono::steady_clock;

void validate(const reaper_options& o) {
  if (o.retention < milliseconds(0))
    throw error(errc::invalid_argument, "reaper retention must not be negative");
  if (o.batch_size < 1 || o.batch_size > 10000)
    throw error(errc::invalid_argument, "reaper batch_size must be 1..10000");
  if (o.jitter < 0 || o.jitter > 1)
    throw error(errc::invalid_argument, "reaper jitter must be 0..1");
  if (o.interval < milliseconds(1))
    throw error(errc::invalid_argument, "reaper interval must be at least 1 ms");
}

retry_policy batch_retry_policy() {
  retry_policy p;
  p.max_attempts = 10;
  p.time_budget = std::chrono::seconds(30);
  p.initial_backoff = milliseconds(5);
  p.max_backoff = milliseconds(200);
  return p;
}

// Phase 1: raise the fence floor to cover every row that is reapable now. Rows created later
// start above the floor, so deleting a row never lets its name's fence go back.
void raise_floor(const std::shared_ptr<detail::database_impl>& db, milliseconds retention) {
  retry(batch_retry_policy(), [&] {
    detail::with_session(db, "reaper: raise fence floor", [&](detail::session_scope& s) {
      if (auto top = detail::lock_table::reapable_fence(s, retention))
        detail::lock_table::raise_floor(s, *top);
    });
  });
}

// Phase 2, one batch: pick unlocked reapable rows covered by the floor (after the name
// `after`, where the table is walked in key order), delete them with the conditions checked
// again.
detail::lock_table::reap_batch_result delete_batch_once(
    const std::shared_ptr<detail::database_impl>& db, const reaper_options& o,
    const std::string& after) {
  return detail::write_transaction(
      db, "reaper: delete expired rows", milliseconds(5000), [&](detail::session_scope& s) {
        return detail::lock_table::reap_batch(s, o.retention, o.batch_size, after);
      });
}

// Reapable rows left, locked or not (a plain read).
long long count_reapable(const std::shared_ptr<detail::database_impl>& db,
                         const reaper_options& o) {
  return detail::with_session(db, "reaper: count expired rows", [&](detail::session_scope& s) {
    return detail::lock_table::count_reapable(s, o.retention);
  });
}

// A batch that meets a deadlock or a busy database (other reapers, SQLite's single writer) is
// retried: it changed nothing.
detail::lock_table::reap_batch_result delete_batch(const std::shared_ptr<detail::database_impl>& db,
                                                   const reaper_options& o,
                                                   const std::string& after) {
  return retry(batch_retry_policy(), [&] { return delete_batch_once(db, o, after); });
}

// Phase 2: batches until nothing is left or the budget is spent.
void delete_all(const std::shared_ptr<detail::database_impl>& db, const reaper_options& o,
                reap_result& r, clock_type::time_point start,
                const std::function<bool()>& stop_requested) {
  int short_rounds = 0;
  std::string after;  // where the next batch goes on, in a walk in key order
  for (;;) {
    if (stop_requested && stop_requested()) return;
    if (o.time_budget.count() > 0 && clock_type::now() - start >= o.time_budget) return;
    const auto batch = delete_batch(db, o, after);
    const std::uint64_t n = batch.deleted;
    db->notify([&](listener& l) { l.rows_reaped(n, 1); });
    ++r.batches;
    r.rows_reaped += n;
    r.elapsed = std::chrono::duration_cast<microseconds>(clock_type::now() - start);
    after = batch.after;
    if (batch.end) {
      // The end of the walk (or of the expiry order) means "nothing left" only if no reapable
      // row remains at all: rows that SKIP LOCKED passed over may belong to a reaper whose
      // batch then rolled back. Look again (a plain count, no locks) for a while before
      // leaving them to the next run; a walk in key order starts again from the first name.
      after.clear();
      if (count_reapable(db, o) == 0)
        r.complete = true;
      else if (++short_rounds > 50)
        return;
      else
        std::this_thread::sleep_for(milliseconds(20));
    }
    if (o.on_batch) o.on_batch(r);
    if (r.complete) return;
  }
}

// Queue entries of waiters that died (or gave up without deleting them) expired long ago:
// nothing reads them any more. They go after min(retention, 1 min).
std::uint64_t reap_waiters(const std::shared_ptr<detail::database_impl>& db,
                           const reaper_options& o) {
  const auto after = std::min<milliseconds>(o.retention, std::chrono::minutes(1));
  return retry(batch_retry_policy(), [&] {
    return detail::with_session(
        db, "reap expired waiter queue entries",
        [&](detail::session_scope& s) { return detail::wait_queue::reap(s, after); });
  });
}

// Runs of periodic jobs older than the retention: nothing decides on them any more (a slot is
// decided by its own runs, all newer). Once-ever runs stay.
std::uint64_t reap_runs(const std::shared_ptr<detail::database_impl>& db, const reaper_options& o) {
  return retry(batch_retry_policy(), [&] {
    return detail::write_transaction(
        db, "reap old runs of periodic jobs", std::nullopt, [&](detail::session_scope& s) {
          return static_cast<std::uint64_t>(detail::run_table::reap(s, o.retention));
        });
  });
}

}  // namespace

reap_result reap_once(const database& db, const reaper_options& options) {
  validate(options);
  const auto start = clock_type::now();
  reap_result r;
  raise_floor(detail::access::impl(db), options.retention);
  if (options.floor_grace.count() > 0) std::this_thread::sleep_for(options.floor_grace);
  delete_all(detail::access::impl(db), options, r, start, nullptr);
  r.waiters_reaped = reap_waiters(detail::access::impl(db), options);
  r.runs_reaped = reap_runs(detail::access::impl(db), options);
  r.elapsed = std::chrono::duration_cast<microseconds>(clock_type::now() - start);
  return r;
}

struct reaper::impl {
  database db;
  reaper_options options;
  mutable std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  reaper_metrics metrics;
  std::thread thread;

  impl(database d, reaper_options o) : db(std::move(d)), options(std::move(o)) {}

  void run() {
    std::mt19937_64 rng(std::random_device{}());
    for (;;) {
      // Delete what the previous run's floor covers, then raise the floor for the next run:
      // the interval between runs is the floor grace.
      const auto start = clock_type::now();
      reap_result r;
      std::optional<error> failure;
      try {
        delete_all(detail::access::impl(db), options, r, start, [this] {
          std::lock_guard<std::mutex> lk(mu);
          return stopping;
        });
        bool stop_now;
        {
          std::lock_guard<std::mutex> lk(mu);
          stop_now = stopping;
        }
        if (!stop_now) {
          r.waiters_reaped = reap_waiters(detail::access::impl(db), options);
          r.runs_reaped = reap_runs(detail::access::impl(db), options);
          raise_floor(detail::access::impl(db), options.retention);
        }
      } catch (const error& e) {
        failure = e;
      } catch (const std::exception& e) {
        failure = error(errc::backend_error, std::string("reaper: ") + e.what());
      } catch (...) {
        // A callback (on_batch) threw something that is not an exception class: keep the
        // thread alive and report it like any failed run.
        failure = error(errc::backend_error, "reaper: unknown exception from a callback");
      }
      {
        std::lock_guard<std::mutex> lk(mu);
        metrics.rows_reaped += r.rows_reaped;
        metrics.batches += r.batches;
        ++metrics.runs;
        if (failure) {
          ++metrics.failed_runs;
          metrics.last_error = failure->what();
        }
      }
      if (failure && options.on_error) {
        try {
          options.on_error(*failure);
        } catch (...) {
        }
      }
      double factor =
          1.0 + std::uniform_real_distribution<double>(-options.jitter, options.jitter)(rng);
      auto wait = std::chrono::duration_cast<milliseconds>(options.interval * factor);
      std::unique_lock<std::mutex> lk(mu);
      if (cv.wait_for(lk, wait, [this] { return stopping; })) return;
    }
  }
};

reaper::reaper(database db, reaper_options options) {
  validate(options);
  impl_ = std::make_unique<impl>(std::move(db), std::move(options));
  impl_->thread = std::thread([this] { impl_->run(); });
}

reaper::~reaper() {
  stop();
}

void reaper::stop() noexcept {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

reaper_metrics reaper::metrics() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->metrics;
}

}  // namespace dblock
