// periodic_runner (runs.hpp): a thread per replica that calls run_in_slot() at the start of each
// slot of the database clock; the slot's record in job_run makes one replica run it.
#include <algorithm>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/identifier.hpp"
#include "dblock/runs.hpp"
#include "lease/lock_impl.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock {

using std::chrono::microseconds;
using std::chrono::milliseconds;

struct periodic_runner::impl {
  database db;
  std::string name;
  milliseconds period;
  job_function job;
  periodic_options o;
  cancellation stop;  // o.run.cancel: stop() and the caller's own cancel() alike
  mutable std::mutex m;
  periodic_stats stats;
  std::thread thread;

  impl(const database& d, std::string n, milliseconds p, job_function j, periodic_options opt)
      : db(d),
        name(std::move(n)),
        period(p),
        job(std::move(j)),
        o(std::move(opt)),
        stop(o.run.cancel) {}

  void error_seen(std::exception_ptr e) {
    {
      const std::lock_guard<std::mutex> l(m);
      ++stats.errors;
    }
    if (o.on_error) o.on_error(std::move(e));
  }

  // Sleeps until just after slot `slot` ends on the database clock. False when it could not
  // read the clock (the error was reported).
  bool sleep_past(std::int64_t slot) {
    std::int64_t now_us = 0;
    try {
      now_us = detail::with_session(
          detail::access::impl(db), "read the database clock",
          [](detail::session_scope& s) { return detail::run_table::now_us(s); });
    } catch (...) {
      error_seen(std::current_exception());
      return false;
    }
    const std::int64_t next_us = (slot + 1) * static_cast<std::int64_t>(period.count()) * 1000;
    // 2 ms past the boundary: a clock read a round trip old never lands in the slot just done.
    stop.sleep_for(microseconds(std::max<std::int64_t>(next_us - now_us, 0) + 2000));
    return true;
  }

  // One try of the current slot; returns the slot to sleep past, or none to retry after
  // retry_after (busy, or a database error before the job ran).
  std::optional<std::int64_t> attempt() {
    std::optional<std::int64_t> job_slot;
    try {
      const run_result r = run_in_slot(
          db, name, period,
          [&](lease_guard& g, std::int64_t slot) {
            job_slot = slot;
            return job(g, slot);
          },
          o.run);
      const std::lock_guard<std::mutex> l(m);
      stats.last_slot = r.slot;
      switch (r.what) {
        case run_result::outcome::ran:
          ++stats.ran;
          if (r.status == 0) ++stats.succeeded;
          return r.slot;
        case run_result::outcome::done_already:
          ++stats.done_elsewhere;
          return r.slot;
        case run_result::outcome::busy:
          ++stats.busy;
          return std::nullopt;
      }
    } catch (...) {
      if (!job_slot && stop.cancelled()) return std::nullopt;  // stop() ended the wait
      if (job_slot) {
        const std::lock_guard<std::mutex> l(m);
        ++stats.ran;
        stats.last_slot = *job_slot;
      }
      error_seen(std::current_exception());
    }
    return job_slot;  // a failed job: not again in its slot; else retry
  }

  void loop() {
    while (!stop.cancelled()) {
      const std::optional<std::int64_t> done = attempt();
      if (stop.cancelled()) break;
      if (!done || !sleep_past(*done)) stop.sleep_for(o.retry_after);
    }
  }
};

periodic_runner::periodic_runner(const database& db, std::string name, milliseconds period,
                                 job_function job, periodic_options o) {
  if (period.count() <= 0)
    throw error(errc::invalid_argument, "periodic_runner: the period must be above zero");
  if (!job) throw error(errc::invalid_argument, "periodic_runner: the job is empty");
  detail::validate_lease_name(name);
  impl_ = std::make_unique<impl>(db, std::move(name), period, std::move(job), std::move(o));
  impl_->thread = std::thread([p = impl_.get()] { p->loop(); });
}

periodic_runner::~periodic_runner() {
  stop();
}

void periodic_runner::stop() noexcept {
  if (!impl_) return;
  impl_->stop.cancel();
  // From the job itself: only the request; the loop ends when the job returns.
  if (impl_->thread.joinable() && impl_->thread.get_id() != std::this_thread::get_id())
    impl_->thread.join();
}

const cancellation& periodic_runner::stopping() const noexcept {
  return impl_->stop;
}

periodic_stats periodic_runner::stats() const noexcept {
  const std::lock_guard<std::mutex> l(impl_->m);
  return impl_->stats;
}

}  // namespace dblock
