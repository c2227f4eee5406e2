// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <system_error>

/// @file
/// @brief dblock's one exception type, dblock::error, and its codes, dblock::errc.

namespace dblock {

/**
 * @brief What went wrong, independent of the backend.
 *
 * Each code says how a caller should react (see retry_advice()):
 * - retry the call: `lock_not_available`, `timeout`, `pool_exhausted`, `connection_lost` (on a
 *   fresh connection);
 * - retry the whole read-modify-write transaction: `deadlock`, `serialization_failure`,
 *   `version_conflict`;
 * - do not retry blindly: `in_doubt` (resolve by reading the row by owner token), `lease_lost`,
 *   `not_owner`, `unique_violation`, `invalid_argument`, `not_found`, `schema_missing`,
 * `schema_mismatch`, `connection_failed`, `cancelled`, `backend_error`.
 *
 * @anchor database_errors
 * **Database errors.** Besides the codes its own entry names, every call that talks to the
 * database may throw: `pool_exhausted` when no pooled connection frees up within
 * database_options::pool_wait (`timeout` when the call's own wait or deadline ends first),
 * `connection_failed` when a connection cannot be opened,
 * `connection_lost` when the connection breaks (where that leaves the outcome of a write
 * unknown, the entry says so: mostly `in_doubt`), `schema_missing` when dblock's tables do not
 * exist (run migrate()), and `backend_error` for anything else the server reports.
 */
enum class errc : int {
  timeout = 1,            ///< our own wait, deadline or time budget ran out (also PostgreSQL
                          ///< 57014)
  cancelled,              ///< the caller cancelled a wait
  lock_not_available,     ///< NOWAIT conflict, server lock wait timeout, SQLite BUSY
  deadlock,               ///< the server chose this transaction as a deadlock victim
  serialization_failure,  ///< PostgreSQL 40001, SQLite BUSY_SNAPSHOT
  unique_violation,       ///< a unique index rejected a row
  version_conflict,       ///< an optimistic update found a newer version (retries exhausted)
  lease_lost,             ///< the lease expired or was taken over; the holder must stop
  not_owner,              ///< the operation needs a lease this caller does not hold
  connection_lost,        ///< the connection broke before anything was written (writes whose
                          ///< outcome is unknown report in_doubt instead; a read cut off at its
                          ///< deadline is timeout)
  connection_failed,      ///< could not connect: unreachable, refused, bad credentials
  in_doubt,               ///< the outcome of a COMMIT or release is unknown
  invalid_argument,       ///< bad URL, identifier, resource name, duration, ...
  not_found,              ///< the row to update does not exist
  schema_missing,         ///< dblock's tables do not exist: run `dblock migrate`
  schema_mismatch,        ///< an applied migration differs from the one shipped
  backend_error,          ///< any other error reported by the database
  pool_exhausted,         ///< no pooled connection freed up within database_options::pool_wait
};

/// How a caller should react to an error code.
enum class retry_advice {
  retry_call,         ///< the same call may simply be repeated (after a backoff)
  retry_transaction,  ///< roll back and repeat the whole read-modify-write
  do_not_retry,       ///< repeating cannot help, or could do harm (in_doubt)
};

/// Short stable name of a code, such as "lock_not_available"; "unknown" for a value that is no
/// errc. Thread-safety: safe from any thread (returns a static string).
const char* to_string(errc code) noexcept;

/// The advice documented on errc for one code.
/// Thread-safety: safe from any thread.
retry_advice advice_for(errc code) noexcept;

/**
 * @brief The std::error_category of dblock::errc ("dblock"); its message() is to_string().
 *
 * Codes with a standard equivalent compare equal to it: `e.code() == std::errc::timed_out` holds
 * for errc::timeout, and likewise cancelled / `operation_canceled`, lock_not_available /
 * `device_or_resource_busy`, deadlock / `resource_deadlock_would_occur`, connection_lost /
 * `connection_aborted`, invalid_argument / `invalid_argument`, not_owner /
 * `operation_not_permitted` (what std::unique_lock reports), pool_exhausted /
 * `resource_unavailable_try_again`. Thread-safety: safe from any thread (one static instance).
 */
const std::error_category& error_category() noexcept;

/// Makes errc usable as a std::error_code (found by argument-dependent lookup).
/// Thread-safety: safe from any thread.
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), error_category()};
}

/**
 * @brief The one exception type of dblock.
 *
 * A std::system_error: code() is the std::error_code of a dblock::errc in the "dblock"
 * category (compare it with `dblock::errc::timeout`, or with a `std::errc` equivalent, see
 * error_category()); kind() is the errc itself, for a `switch`. It carries the backend that
 * reported it ("postgresql", "mysql", "sqlite" or empty), the SQLSTATE (PostgreSQL, and MySQL
 * where known) and the backend's native error number. what() is the message alone. Messages
 * never contain passwords. Codes, attempts() and elapsed() are documented on errc and
 * retry_policy.
 *
 * Thread-safety: the const members may be called concurrently; with_retry_info() (used by retry
 * loops before they throw) is the one modifier. Copies are independent.
 */
class error : public std::system_error {
 public:
  /// An error with no backend detail. Throws only std::bad_alloc.
  error(errc code, const std::string& message);
  /// An error classified from a backend error. Throws only std::bad_alloc.
  error(errc code, const std::string& message, std::string backend, std::string sqlstate,
        long long native_code);

  /// The classified code, as an enum (code(), inherited from std::system_error, is the same as a
  /// std::error_code).
  errc kind() const noexcept { return kind_; }
  /// The same as code(): the code as a std::error_code in dblock's category.
  std::error_code error_code() const noexcept { return make_error_code(kind_); }
  /// The message, without the ": <code>" that std::system_error would append.
  const char* what() const noexcept override { return message_.c_str(); }
  /// Backend name ("postgresql", "mysql", "sqlite"), empty when not from a backend.
  const std::string& backend() const noexcept { return backend_; }
  /// Five-character SQLSTATE when the backend reported one, else empty.
  const std::string& sqlstate() const noexcept { return sqlstate_; }
  /// Native error number (MySQL errno, SQLite extended result code), 0 when none.
  long long native_code() const noexcept { return native_code_; }
  /// How a caller should react (see errc).
  retry_advice advice() const noexcept { return advice_for(kind_); }
  /// Attempts made when a retry loop gave up (0 when the error is not from a retry loop).
  int attempts() const noexcept { return attempts_; }
  /// Time spent by the retry loop that gave up (zero when not from a retry loop).
  std::chrono::microseconds elapsed() const noexcept { return elapsed_; }
  /// Records how many attempts a retry loop made and how long it ran; returns `*this`.
  error& with_retry_info(int attempts, std::chrono::microseconds elapsed) noexcept {
    attempts_ = attempts;
    elapsed_ = elapsed;
    return *this;
  }

 private:
  errc kind_;
  std::string message_;
  std::string backend_;
  std::string sqlstate_;
  long long native_code_ = 0;
  int attempts_ = 0;
  std::chrono::microseconds elapsed_{0};
};

}  // namespace dblock

namespace std {
/// Lets dblock::errc convert implicitly to std::error_code (e.g. `ec == dblock::errc::timeout`).
/// Thread-safety: a compile-time trait.
template <>
struct is_error_code_enum<dblock::errc> : true_type {};
}  // namespace std
