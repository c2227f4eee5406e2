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

/// @file
/// @brief Optimistic updates (versioned_update()) and conditional updates (compare_and_set()).

namespace dblock {

/// Where a versioned row lives. Every name is validated as an identifier and quoted.
/// Thread-safety: a plain value.
struct versioned_table {
  std::string table;                       ///< e.g. "t_account"
  std::string key_column;                  ///< unique key, e.g. "id"
  std::string version_column = "version";  ///< integer column incremented by every write
  std::vector<std::string> columns;        ///< columns read and written back (not key or version)
};

/// Outcome of a versioned update.
/// Thread-safety: a plain value.
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
 * The read is a plain read that has ended before `mutate` runs, and only the UPDATE writes:
 * while `mutate` runs dblock holds no row lock and, on SQLite, not the database-wide write lock,
 * so other writers and leases on the same database do not wait for it, and a concurrent update
 * of the row makes this attempt conflict rather than wait (promise D3 of docs/safety.md).
 * Affected rows mean matched rows on every backend (dblock's MySQL connections set
 * CLIENT_FOUND_ROWS), so writing unchanged values is not mistaken for a conflict.
 * The read and the UPDATE are prepared once per pooled connection (the read after its first
 * run there) when the key and the values written are integers or strings (a NULL or a double
 * goes through SOCI, parsed each time): an attempt then costs two round trips and no re-parse.
 * Thread-safety: safe to call concurrently; each call uses its own pooled connection.
 *
 * @throws dblock::error errc::version_conflict (or the starving error's own code: deadlock,
 *         serialization_failure, lock_not_available) when the policy is exhausted (attempts() and
 *         elapsed() set; nothing of the failed attempts is visible); errc::invalid_argument for
 *         bad identifiers, empty `columns`, the key or version column among `columns`, a column
 *         of an unsupported type, a version column that is not a non-NULL integer, a `mutate`
 *         that adds or removes columns, or a policy with max_attempts < 1; errc::not_found when
 *         no row has the key; errc::in_doubt when the connection broke after the UPDATE was
 *         sent and the row then holds another version (this call's write or another writer's:
 *         read the row, do not retry blindly; the server session has been ended first, so the
 *         read is final, unless the message says it could not be). A lost reply whose row still
 *         holds the version read did not take effect and is sent again, as is a broken read;
 *         errc::connection_lost only when three sends broke (nothing was written); other classified
 * errors, such as the rest of the @ref database_errors "database errors". Exceptions of `mutate`
 * propagate as they are (a dblock::error with a retryable code is retried).
 */
versioned_result versioned_update(const database& db, const versioned_table& spec, const value& key,
                                  const std::function<void(record&)>& mutate,
                                  const retry_policy& policy = {});

/**
 * @brief One attempt of versioned_update() on the caller's connection, inside the caller's
 *        transaction if one is open. A conflict throws errc::version_conflict: roll back and
 *        retry the whole transaction (run_transaction() in transaction.hpp does).
 *
 * Inside a transaction `mutate` runs with whatever locks that transaction holds (on SQLite a
 * write transaction holds the database-wide write lock); without one, as versioned_update().
 * Thread-safety: as the connection's (one thread at a time).
 * @throws dblock::error errc::version_conflict; errc::not_found and errc::invalid_argument as
 *         versioned_update() above; the classified errors of its statements (a broken connection
 *         is errc::connection_lost when nothing was written: inside a transaction, or without
 *         one when the lost UPDATE was read back as not applied; nothing is sent again on the
 *         caller's connection; errc::in_doubt as versioned_update() above). Exceptions of `mutate`
 * propagate as they are.
 */
versioned_result versioned_update(database::connection& conn, const versioned_table& spec,
                                  const value& key, const std::function<void(record&)>& mutate);

/// A conditional update: `UPDATE table SET <set> WHERE <where>` with named parameters.
/// Thread-safety: a plain value.
struct cas_update {
  std::string table;  ///< validated identifier
  /// SQL fragments written by the programmer (never from user input); values go in `params`
  /// and are referenced as :name, as in set = "stock = stock - :qty", where = "id = :id AND
  /// stock >= :qty".
  std::string set;
  /// The condition, an SQL fragment like `set` (not empty).
  std::string where;
  /// Values bound to the `:name` parameters of `set` and `where` (names are identifiers).
  std::vector<std::pair<std::string, value>> params;
};

/**
 * @brief Runs a conditional update and returns the number of rows it matched.
 *
 * Zero is an answer ("the condition did not hold"), not an error, and is never retried; only
 * retryable errors (deadlock, serialization failure, SQLite BUSY) are retried under `policy`.
 * Matched rows are counted the same on every backend, also when the new values equal the old.
 * When every value in `params` is an integer or a string and `set` and `where` use exactly the
 * parameters given, the statement is prepared once per connection (PostgreSQL, SQLite; up to
 * 64 distinct statements per connection, then unprepared) and costs one round trip; otherwise
 * (a NULL or a double) SOCI runs it unprepared, binding each value with its type.
 * Thread-safety: safe to call concurrently; each call uses its own pooled connection.
 *
 * @throws dblock::error errc::invalid_argument for a bad table or parameter name, an empty `set`
 *         or `where`, or a policy with max_attempts < 1; the last attempt's own code
 *         (attempts() > 0) when the policy is exhausted; errc::in_doubt when the connection
 *         broke after the statement was sent (the update may or may not have been applied; the
 *         caller's `set` and `where` are all dblock knows, so it cannot read the outcome back:
 *         the server session is ended first and the message says whether a read of the row now
 *         gives the final outcome); the
 *         classified errors of the statement (errc::unique_violation, errc::backend_error for
 *         bad SQL in `set` or `where`, ...) and the @ref database_errors "database errors".
 */
std::uint64_t compare_and_set(const database& db, const cas_update& update,
                              const retry_policy& policy = {});

/// compare_and_set() on the caller's connection (inside its transaction, if open); no retry.
/// Thread-safety: as the connection's (one thread at a time).
/// @throws dblock::error as compare_and_set() above, except that nothing is retried and a broken
///         connection inside the caller's transaction is errc::connection_lost (rolled back:
///         nothing was written); without one a lost reply is errc::in_doubt, as above.
std::uint64_t compare_and_set(database::connection& conn, const cas_update& update);

}  // namespace dblock
