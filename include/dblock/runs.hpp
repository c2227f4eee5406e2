#pragma once

/// @file
/// @brief Jobs that run once ever or once per slot of the database clock, across every process
/// that calls them: run_once(), run_in_slot(), and their record, list_runs() and forget_runs()
/// (docs/run-once.md; `dblock exec --once` / `--every` from the shell).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
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
