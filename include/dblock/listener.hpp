// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

#include "dblock/error.hpp"

namespace dblock {

/// Severity of a log message passed to listener::log().
enum class log_level { debug, info, warning, error };

/**
 * @brief Receives what dblock does, for metrics and logs. dblock itself never prints.
 *
 * Attach one through database_options::events; every component using that database reports
 * to it. Each hook has an empty default, so override only what you need; with no listener set,
 * reporting costs one pointer check. Hooks are called synchronously from the thread doing the
 * work (callers' threads, watchdog and reaper threads), possibly concurrently: implementations
 * must be thread-safe, fast and must not throw (exceptions are swallowed).
 */
class listener {
 public:
  virtual ~listener() = default;
  /// A lease was acquired (or re-entered); `latency` covers the whole call, retries included.
  virtual void acquired(std::string_view name, std::int64_t fence,
                        std::chrono::microseconds latency) {
    (void)name, (void)fence, (void)latency;
  }
  /// A try found the lease held by another owner (one per failed try or poll).
  virtual void contended(std::string_view name) { (void)name; }
  /// An operation hit a transient error (deadlock, busy, lost connection) and is retried.
  virtual void retried(std::string_view operation, const error& cause) {
    (void)operation, (void)cause;
  }
  /// One hold of a lease was released; `held` is the time since it was acquired.
  virtual void released(std::string_view name, std::chrono::microseconds held) {
    (void)name, (void)held;
  }
  /// A renewal failed with a transient error; the watchdog tries again while the lease is valid.
  virtual void renew_failed(std::string_view name, const error& cause) { (void)name, (void)cause; }
  /// A lease was found lost (expired, taken over, or force-released).
  virtual void lease_lost(std::string_view name, const error& cause) { (void)name, (void)cause; }
  /// The reaper deleted `rows` expired rows in `batches` delete transactions.
  virtual void rows_reaped(std::uint64_t rows, std::uint64_t batches) { (void)rows, (void)batches; }
  /// A diagnostic message.
  virtual void log(log_level level, std::string_view message) { (void)level, (void)message; }
};

}  // namespace dblock
