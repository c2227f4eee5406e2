// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/retry.hpp"
#include "dblock/value.hpp"

namespace dblock {

/// Where a versioned row lives. Every name is validated as an identifier and quoted.
struct versioned_table {
  std::string table;                       ///< e.g. "t_account"
  std::string key_column;                  ///< unique key, e.g. "id"
  std::string version_column = "version";  ///< integer column incremented by every write
  std::vector<std::string> columns;        ///< columns read and written back
};

/// Outcome of a versioned update.
struct versioned_result {
  long long version = 0;  ///< the version this call wrote (old version + 1)
  record values;          ///< the values written
  retry_stats stats;      ///< attempts and conflicts (standalone form only)
};

/**
 * @brief Optimistic read-modify-write of one row.
 *
 * Each attempt reads `columns` and the version, calls `mutate` on the values, then runs one
 * conditional `UPDATE … SET …, version = version + 1 WHERE key = ? AND version = ?`. Zero
 * matched rows is a conflict (errc::version_conflict), which `policy` retries with a fresh read.
 * `mutate` may be called several times and must not have side effects outside `values`.
 * Affected rows mean matched rows on every backend (dblock's MySQL connections set
 * CLIENT_FOUND_ROWS), so writing unchanged values is not mistaken for a conflict.
 * Thread-safety: safe to call concurrently; each call uses its own pooled connection.
 *
 * @throws dblock::error errc::version_conflict (or the starving error's own code: deadlock,
 *         serialization_failure, lock_not_available) when the policy is exhausted (attempts() and
 *         elapsed() set; nothing of the failed attempts is visible), errc::invalid_argument for
 *         bad identifiers or a column of an unsupported type, errc::not_found when no row has
 *         the key, and other classified errors.
 */
versioned_result versioned_update(const database& db, const versioned_table& spec, const value& key,
                                  const std::function<void(record&)>& mutate,
                                  const retry_policy& policy = {});

/**
 * @brief One attempt of versioned_update() on the caller's connection, inside the caller's
 *        transaction if one is open. A conflict throws errc::version_conflict: roll back and
 *        retry the whole transaction (see run_transaction() in row_lock.hpp).
 */
versioned_result versioned_update(database::connection& conn, const versioned_table& spec,
                                  const value& key, const std::function<void(record&)>& mutate);

/// A conditional update: `UPDATE table SET <set> WHERE <where>` with named parameters.
struct cas_update {
  std::string table;  ///< validated identifier
  /// SQL fragments written by the programmer (never from user input); values go in `params`
  /// and are referenced as :name, e.g. set = "stock = stock - :qty", where = "id = :id AND
  /// stock >= :qty".
  std::string set;
  std::string where;
  std::vector<std::pair<std::string, value>> params;
};

/**
 * @brief Runs a conditional update and returns the number of rows it matched.
 *
 * Zero is an answer ("the condition did not hold"), not an error, and is never retried; only
 * retryable errors (deadlock, serialization failure, SQLite BUSY) are retried under `policy`.
 * Matched rows are counted the same on every backend, also when the new values equal the old.
 */
std::uint64_t compare_and_set(const database& db, const cas_update& update,
                              const retry_policy& policy = {});

/// compare_and_set() on the caller's connection (inside its transaction, if open); no retry.
std::uint64_t compare_and_set(database::connection& conn, const cas_update& update);

}  // namespace dblock
