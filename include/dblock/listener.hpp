// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dblock/error.hpp"

/// @file
/// @brief dblock::listener, the hooks through which dblock reports events and log messages.

namespace dblock {

/// Severity of a log message passed to listener::log().
enum class log_level {
  debug,    ///< details for debugging dblock itself
  info,     ///< normal operation worth recording
  warning,  ///< something went wrong and was handled, or may go wrong
  error     ///< something failed
};

/**
 * @brief Receives what dblock does, for metrics and logs. dblock itself never prints.
 *
 * Attach one through database_options::events; every component using that database reports
 * to it. Each hook has an empty default, so override only what you need; with no listener set,
 * reporting costs one pointer check. Hooks are called synchronously from the thread doing the
 * work (callers' threads, watchdog and reaper threads), possibly concurrently.
 *
 * Thread-safety: implementations must be thread-safe, fast and must not throw (exceptions are
 * swallowed, never reach the operation that reported). The default hooks do nothing and never
 * throw.
 */
class listener {
 public:
  /// Destroyed with the last database_options (and database copy) holding it. Must not throw.
  virtual ~listener() = default;
  /// A lease was acquired (or re-entered); `latency` covers the whole call, retries included.
  /// Default: nothing. Must not throw (as every hook).
  virtual void acquired(std::string_view name, std::int64_t fence,
                        std::chrono::microseconds latency) {
    (void)name, (void)fence, (void)latency;
  }
  /// A try found the lease held by another owner (one per failed try or poll). Default:
  /// nothing. Must not throw.
  virtual void contended(std::string_view name) { (void)name; }
  /// An operation hit a transient error (deadlock, busy) and is retried; `operation` names it
  /// ("acquire lease"). Default: nothing. Must not throw.
  virtual void retried(std::string_view operation, const error& cause) {
    (void)operation, (void)cause;
  }
  /// One hold of a lease was released; `held` is the time since it was acquired. Default:
  /// nothing. Must not throw.
  virtual void released(std::string_view name, std::chrono::microseconds held) {
    (void)name, (void)held;
  }
  /// The watchdog renewed `leases` leases of one batch (this database handle's leases that were
  /// due together, at most 512; a lease whose row another transaction holds locked is skipped
  /// and retried) with `round_trips` statements, BEGIN and COMMIT included. Called on the
  /// handle's renewal thread. Default: nothing. Must not throw.
  virtual void renewed(std::size_t leases, std::size_t round_trips) {
    (void)leases, (void)round_trips;
  }
  /// A renewal failed with a transient error; the watchdog tries again while the lease is valid.
  /// Default: nothing. Must not throw.
  virtual void renew_failed(std::string_view name, const error& cause) { (void)name, (void)cause; }
  /// A lease was found lost (expired, taken over, or force-released). Default: nothing. Must
  /// not throw.
  virtual void lease_lost(std::string_view name, const error& cause) { (void)name, (void)cause; }
  /// The reaper deleted `rows` expired rows in `batches` delete transactions. Default: nothing.
  /// Must not throw.
  virtual void rows_reaped(std::uint64_t rows, std::uint64_t batches) { (void)rows, (void)batches; }
  /// A waiting acquire of this process was woken because the lease `name` was freed (at most
  /// one per release and process, see docs/waiting.md). Called on the releasing or the
  /// listening thread, with the wake-up registry locked: must return quickly. Default: nothing.
  /// Must not throw.
  virtual void woken(std::string_view name) { (void)name; }
  /**
   * A lease of `ttl` was granted on a database whose cluster takes longer to go on after losing
   * a node than such a lease can wait for its renewal (database::failover()): if the holder's
   * node is lost, the lease expires before the watchdog can renew it through another node, and
   * its holder is told the lease was lost (safe, but its work stops). `min_ttl` is the least TTL
   * that survives; `message` says so in words. Reported once per database handle and TTL.
   * Default: log(log_level::warning, message).
   */
  virtual void short_ttl(std::string_view name, std::chrono::milliseconds ttl,
                         std::chrono::milliseconds min_ttl, std::string_view message) {
    (void)name, (void)ttl, (void)min_ttl;
    log(log_level::warning, message);
  }
  /// A diagnostic message. Default: nothing. Must not throw.
  virtual void log(log_level level, std::string_view message) { (void)level, (void)message; }
};

}  // namespace dblock
