#pragma once

/// @file
/// @brief Jobs that run once ever or once per slot of the database clock, across every process
/// that calls them: run_once(), run_in_slot(), periodic_runner (a replica's own schedule),
/// complete_run(), and their record, list_runs() and forget_runs() (docs/run-once.md;
/// `dblock exec --once` / `--every` from the shell).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/lease_lock.hpp"

namespace dblock {

/// One run of a job: a row of the runs table.
struct job_run {
  std::string key;       ///< run_once()'s key, or run_in_slot()'s name
  std::int64_t slot{};   ///< 0 for run_once(); floor(database time / period) for run_in_slot()
  std::int64_t fence{};  ///< the fence of the lease the run held
  std::chrono::milliseconds period{0};               ///< 0 for run_once()
  std::string host;                                  ///< where it ran (the host name)
  std::int64_t pid{};                                ///< the process that ran it
  std::chrono::system_clock::time_point started_at;  ///< on the database clock
  /// On the database clock; none while it runs, or when it ended without a record (its lease
  /// was lost, its process was killed): such a run did not succeed.
  std::optional<std::chrono::system_clock::time_point> ended_at;
  std::optional<int> exit_status;  ///< the job's status (0 success); none without an end
  bool succeeded = false;          ///< ended with status 0, recorded under its lease
  /// Set by forget_runs(): the success no longer makes its key and slot done.
  std::optional<std::chrono::system_clock::time_point> forgotten_at;
  std::string forgotten_by;   ///< who forgot it (empty when not forgotten)
  std::string forget_reason;  ///< why (empty when not forgotten)
};

/// How run_once() and run_in_slot() hold and wait.
struct run_options {
  /// The lease held while the job runs (its name is the key); the watchdog is always on.
  lease_options lease;
  /// How long to wait while another process runs the job (0: do not wait; busy then).
  std::chrono::milliseconds wait{0};
  /// Ends that wait early (errc::cancelled).
  cancellation cancel;
};

/// What run_once() or run_in_slot() found and did.
struct run_result {
  /// What happened to the job.
  enum class outcome {
    ran,           ///< the job ran here; `status` is its outcome, recorded
    done_already,  ///< a success is recorded for the key and slot: the job did not run
    busy           ///< another process runs it (the wait ran out): the job did not run
  };
  outcome what = outcome::busy;    ///< ran, done_already or busy
  std::int64_t slot = 0;           ///< the slot the job ran or was found done in
  std::int64_t fence = 0;          ///< ran: the fence of its lease
  int status = 0;                  ///< ran: the job's status, 0 for success
  std::optional<job_run> done_by;  ///< done_already: the success found
};

/**
 * @brief The job: it runs holding `lease` (its fence for fenced writes, lost() to stop when
 * the lease ends) in `slot`, and returns its status, 0 for success. An exception is a failure:
 * it is recorded (status 1) and rethrown.
 */
using job_function = std::function<int(lease_guard& lease, std::int64_t slot)>;

/**
 * @brief Runs `job` unless a success of `key` is recorded: at most one success ever, across
 * every process and host that calls it with the same key (deploy migrations, one-off
 * backfills). The key is the lease's name.
 *
 * Takes the lease `key` (waiting up to o.wait while another process runs it), then in one fenced
 * transaction reads whether a success is recorded and, if not, records the run's start; runs
 * `job`; and records its end and status in a fenced transaction of the same lease, so a holder
 * that lost the lease records nothing. A failed run (status not 0, an exception, a killed
 * process, a lost lease) leaves the key not done: the next caller runs it.
 * @throws dblock::error errc::lease_lost when the lease was lost before the end was recorded
 *         (the run counts as not done); errc::invalid_argument for a bad key (as lease_lock);
 *         errc::cancelled; the @ref database_errors "database errors"; whatever `job` throws.
 */
run_result run_once(const database& db, const std::string& key, const job_function& job,
                    const run_options& o = {});

/**
 * @brief Runs `job` unless a success of `name` is recorded in the current slot of the database
 * clock, slot = floor(database time / period): at most one success per slot, however skewed the
 * callers' clocks and however short the job. Call it from every replica, each time its own
 * schedule fires (cron on every host); the first caller in a slot runs it, later ones find it
 * done. A failed slot is retried by the next caller within the same slot; the slot of a run is
 * the one it started in. As run_once() otherwise.
 * @throws as run_once(); errc::invalid_argument when `period` is not above zero.
 */
run_result run_in_slot(const database& db, const std::string& name,
                       std::chrono::milliseconds period, const job_function& job,
                       const run_options& o = {});

/**
 * @brief Inside a job of run_once(), run_in_slot() or a periodic_runner: runs `write` and
 * records the run's success in one fenced transaction of its lease, so that the job's last write
 * and its completion commit together or not at all.
 *
 * Without it, a job that made its last fenced write and then lost its lease (or its process)
 * before the end was recorded leaves the run not done, and the next caller runs the job again
 * after the write had landed. With it, the run is done exactly when the write landed. Call it
 * at most once, as the job's last step; the status the job returns afterwards is ignored (the
 * run succeeded), and an exception the job throws afterwards is rethrown without changing the
 * record. `lease` is the guard the job was given.
 * @throws dblock::error errc::not_owner when `lease` is not the lease of a job running on this
 *         thread, or the run was completed already; as lease_guard::fenced() otherwise
 *         (errc::lease_lost: nothing was written, the run is not done).
 */
void complete_run(lease_guard& lease, const std::function<void(soci::session&)>& write);

/// How a periodic_runner runs its job.
struct periodic_options {
  /// The lease of each run and how long a replica waits while another one runs the slot's job
  /// (run.wait; 0: it tries again after `retry_after` and then finds the slot done). run.cancel
  /// is the runner's own: set it to stop the runner from outside as stop() does.
  run_options run;
  /// How long after a failed try (a database error before the job ran, or another replica
  /// running it past run.wait) the runner tries the same slot again.
  std::chrono::milliseconds retry_after{1000};
  /// Called on the runner's thread with what a try threw: a database error (the slot is tried
  /// again after retry_after) or the job's own exception (the run failed; recorded as status 1).
  /// Must not throw. Without it, errors are only counted (periodic_stats::errors).
  std::function<void(std::exception_ptr)> on_error;
};

/// What a periodic_runner did so far.
struct periodic_stats {
  std::uint64_t ran = 0;             ///< runs of the job in this runner, whatever their status
  std::uint64_t succeeded = 0;       ///< of those, the ones recorded as successes
  std::uint64_t done_elsewhere = 0;  ///< slots this runner found done by another replica
  std::uint64_t busy = 0;            ///< tries that found another replica running the job
  std::uint64_t errors = 0;          ///< tries that threw (on_error saw each)
  std::int64_t last_slot = -1;       ///< the slot of the last try that reached the database
};

/**
 * @brief Runs `job` once per slot of `period` across every replica that runs a periodic_runner
 * of the same name: a thread that wakes at the start of each slot of the database clock and
 * calls run_in_slot() (docs/run-once.md). Start one in every replica of a service; one replica
 * runs each slot, the others find it done.
 *
 * A slot in which every replica was stopped or unreachable is not made up later. A run whose job
 * failed is not tried again by the same runner in that slot (another replica's runner, arriving
 * later in the slot, does run it). The job runs on the runner's thread with the guard of the
 * slot's lease; stopping() tells it that the runner is being stopped.
 * Thread-safety: stop() and stats() may be called from any thread.
 */
class periodic_runner {
 public:
  /// Starts the runner's thread. @throws dblock::error errc::invalid_argument when `period` is
  /// not above zero or `name` is not a valid lease name; std::system_error when no thread starts.
  periodic_runner(const database& db, std::string name, std::chrono::milliseconds period,
                  job_function job, periodic_options o = {});
  /// stop().
  ~periodic_runner();
  periodic_runner(const periodic_runner&) = delete;
  periodic_runner& operator=(const periodic_runner&) = delete;

  /// Stops the runner: its waits end at once, a job in progress runs to its end (it may watch
  /// stopping()), and the thread is joined. Idempotent. Throws nothing. Called from the job
  /// itself, it only requests the stop (the runner must then outlive the job's return).
  void stop() noexcept;
  /// Fires when stop() is called, for the job to end early.
  const cancellation& stopping() const noexcept;
  /// Counts so far. Throws nothing.
  periodic_stats stats() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/**
 * @brief The recorded runs of `key` ("" for every key), newest first, at most `limit`.
 * @throws the @ref database_errors "database errors".
 */
std::vector<job_run> list_runs(const database& db, const std::string& key = "",
                               std::size_t limit = 100);

/**
 * @brief Forgets the recorded successes of `key` (every slot), so that the job may run again;
 * the rows stay, marked with who forgot them, when and why. Returns how many were forgotten.
 * @throws dblock::error errc::invalid_argument for an empty key, a reason over 1000 bytes or
 *         `forgotten_by` over 255 (or either not valid UTF-8); the @ref database_errors
 *         "database errors".
 */
long long forget_runs(const database& db, const std::string& key, const std::string& reason,
                      const std::string& forgotten_by);

}  // namespace dblock
