// Jobs that run once ever or once per slot (runs.hpp): a lease per key, the run's start and end
// written in fenced transactions of that lease on the `job_run` table.
#include "dblock/runs.hpp"

#include <unistd.h>

#include <exception>

#include "core/audit_text.hpp"
#include "core/identifier.hpp"
#include "lease/fenced.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock {

using detail::access;
using detail::session_scope;
using std::chrono::milliseconds;

namespace {

std::chrono::system_clock::time_point from_us(std::int64_t us) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(us));
}

job_run to_job_run(const detail::run_table::run_row& r) {
  job_run j;
  j.key = r.key;
  j.slot = r.slot;
  j.fence = r.fence;
  j.period = milliseconds(r.period_ms);
  j.host = r.host;
  j.pid = r.pid;
  j.started_at = from_us(r.started_us);
  if (r.ended_us != 0) j.ended_at = from_us(r.ended_us);
  j.exit_status = r.exit_status;
  j.succeeded = r.succeeded;
  if (r.forgotten_us != 0) j.forgotten_at = from_us(r.forgotten_us);
  j.forgotten_by = r.forgotten_by;
  j.forget_reason = r.forget_reason;
  return j;
}

// The run of the job running on this thread, for complete_run().
struct current_run {
  const detail::lease_state* lease = nullptr;
  std::string key;
  std::int64_t slot = 0;
  bool completed = false;
};
thread_local current_run* this_thread_run = nullptr;

// Sets this_thread_run for the job's call, and restores the outer one (a job may run another).
class run_scope {
 public:
  explicit run_scope(current_run& r) : outer_(this_thread_run) { this_thread_run = &r; }
  ~run_scope() { this_thread_run = outer_; }
  run_scope(const run_scope&) = delete;
  run_scope& operator=(const run_scope&) = delete;

 private:
  current_run* outer_;
};

// The job's lease, or nothing when another holder keeps it (refused, or the wait ran out).
std::optional<lease_guard> take_job_lease(lease_lock& lock, const run_options& o) {
  try {
    if (o.wait.count() > 0) return lock.acquire(o.wait, o.cancel);
    return lock.try_acquire();
  } catch (const error& e) {
    if (e.code() != errc::timeout) throw;
  }
  return std::nullopt;
}

// run_once() (period 0) and run_in_slot().
run_result run_job(const database& db, const std::string& key, milliseconds period,
                   const job_function& job, const run_options& o) {
  lease_options lo = o.lease;
  lo.watchdog = true;
  lease_lock lock(db, key, lo);
  std::optional<lease_guard> g = take_job_lease(lock, o);
  run_result r;
  if (!g) return r;  // busy
  auto& st = *detail::lease_access::state(*g);
  const std::string what = "run of '" + detail::printable(key) + "'";
  std::optional<detail::run_table::run_row> done;
  // The slot, the check and the start in one fenced transaction, on the database clock.
  detail::fenced_write(
      {&st},
      [&](session_scope& s) {
        const std::int64_t now = detail::run_table::now_us(s);
        const std::int64_t period_us = period.count() * 1000;
        r.slot = period_us > 0 ? now / period_us : 0;
        done = detail::run_table::done(s, key, r.slot, period.count());
        if (!done)
          detail::run_table::start(s, key, r.slot, st.fence, period.count(), detail::host_name(),
                                   ::getpid());
      },
      "start the " + what);
  if (done) {
    r.what = run_result::outcome::done_already;
    r.done_by = to_job_run(*done);
    g->release();
    return r;
  }
  r.fence = g->fence();
  int status = 1;
  std::exception_ptr failure;
  current_run run{&st, key, r.slot, false};
  try {
    const run_scope scope(run);
    status = job(*g, r.slot);
  } catch (...) {
    failure = std::current_exception();
    status = 1;
  }
  if (run.completed) {
    status = 0;  // complete_run() recorded the success with the job's last write
  } else {
    // The end, under the same lease: a holder that lost it records nothing (lease_lost).
    detail::fenced_write(
        {&st},
        [&](session_scope& s) { detail::run_table::finish(s, key, r.slot, st.fence, status); },
        "record the end of the " + what);
  }
  g->release();
  if (failure) std::rethrow_exception(failure);
  r.what = run_result::outcome::ran;
  r.status = status;
  return r;
}

}  // namespace

void complete_run(lease_guard& lease, const std::function<void(soci::session&)>& write) {
  current_run* run = this_thread_run;
  detail::lease_state* st = detail::lease_access::state(lease).get();
  if (!run || !st || run->lease != st)
    throw error(errc::not_owner,
                "complete_run: the guard is not the lease of a job running on this thread");
  if (run->completed) throw error(errc::not_owner, "complete_run: the run is completed already");
  detail::fenced_write(
      {st},
      [&](session_scope& s) {
        write(s.sql());
        detail::run_table::finish(s, run->key, run->slot, st->fence, 0);
      },
      "complete the run of '" + detail::printable(run->key) + "'");
  run->completed = true;
}

run_result run_once(const database& db, const std::string& key, const job_function& job,
                    const run_options& o) {
  return run_job(db, key, milliseconds(0), job, o);
}

run_result run_in_slot(const database& db, const std::string& name, milliseconds period,
                       const job_function& job, const run_options& o) {
  if (period.count() <= 0)
    throw error(errc::invalid_argument, "run_in_slot: the period must be above zero");
  return run_job(db, name, period, job, o);
}

std::vector<job_run> list_runs(const database& db, const std::string& key, std::size_t limit) {
  if (limit < 1 || limit > 100000)
    throw error(errc::invalid_argument, "list_runs: limit must be 1..100000");
  if (!key.empty()) detail::validate_lease_name(key);
  return detail::with_read(access::impl(db), "list runs", [&](session_scope& s) {
    std::vector<job_run> out;
    for (const auto& r : detail::run_table::list(s, key, limit))
      out.push_back(to_job_run(r));
    return out;
  });
}

long long forget_runs(const database& db, const std::string& key, const std::string& reason,
                      const std::string& forgotten_by) {
  detail::validate_lease_name(key);
  detail::validate_audit_text(reason, forgotten_by, "forget_runs", "forgotten_by");
  return detail::write_transaction(
      access::impl(db), "forget the runs of '" + detail::printable(key) + "'", std::nullopt,
      [&](session_scope& s) { return detail::run_table::forget(s, key, forgotten_by, reason); });
}

}  // namespace dblock
