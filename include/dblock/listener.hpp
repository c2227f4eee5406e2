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

/// Why a lease was found lost (listener::lost()).
enum class loss_reason {
  /// Its TTL ran out without a renewal (the row was still this lease's, past its expiry, or
  /// already reaped).
  expired,
  /// Another owner holds the row now (it had expired first).
  taken_over,
  /// An operator force-released it (force_release(), `dblock release --force`).
  forced,
  /// No renewal was confirmed before the local validity ran out: the database could not be
  /// reached or answered too late (frozen server, lost connection, failover).
  connection
};

/// Why an acquire call gave up without the lease (listener::acquire_failed()).
enum class acquire_failure {
  timeout,    ///< its wait ran out (errc::timeout)
  cancelled,  ///< its cancellation fired (errc::cancelled)
  error       ///< any other error (the exception the caller receives says which)
};

/// "expired", "taken_over", "forced" or "connection" (the Prometheus `reason` label).
std::string_view to_string(loss_reason r) noexcept;
/// "timeout", "cancelled" or "error" (the Prometheus `reason` label).
std::string_view to_string(acquire_failure f) noexcept;

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
  /// A database handle was opened with this listener; `backend` is "postgresql", "mysql" or
  /// "sqlite". Called once per handle, before any other hook of it. Default: nothing. Must not
  /// throw (as every hook).
  virtual void attached(std::string_view backend) { (void)backend; }
  /// A lease was acquired (or re-entered); `latency` covers the whole call, its wait and
  /// retries included. Default: nothing.
  virtual void acquired(std::string_view name, std::int64_t fence,
                        std::chrono::microseconds latency) {
    (void)name, (void)fence, (void)latency;
  }
  /// An acquire call found the lease held by another owner: once per call (a try that is
  /// refused, a waiting acquire whose first try was refused), never per poll. Default: nothing.
  /// Must not throw.
  virtual void contended(std::string_view name) { (void)name; }
  /// An acquire call gave up without the lease: its wait ran out, it was cancelled, or it
  /// failed (a try that is merely refused is contended(), not this). `waited` covers the whole
  /// call. Default: nothing. Must not throw.
  virtual void acquire_failed(std::string_view name, acquire_failure why,
                              std::chrono::microseconds waited) {
    (void)name, (void)why, (void)waited;
  }
  /// A waiting acquire of `name` started to wait (`waiting` true: its first try was refused)
  /// or stopped waiting (false: it got the lease or gave up); the calls pair up. Default:
  /// nothing. Must not throw.
  virtual void waiting(std::string_view name, bool waiting) { (void)name, (void)waiting; }
  /// This process started (`held` true) or stopped (false: released, or found lost) holding
  /// the lease `name`, a semaphore permit's or a leadership's included; reentrant holds of one
  /// acquisition count once. The calls pair up. Default: nothing. Must not throw.
  virtual void holding(std::string_view name, bool held) { (void)name, (void)held; }
  /// This process became (`leader` true) or stopped being (false) the leader of `election`.
  /// The calls pair up. Default: nothing. Must not throw.
  virtual void leadership(std::string_view election, bool leader) { (void)election, (void)leader; }
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
  /// One renewal round trip took `latency`: a watchdog's batch (as one renewed() reports) or
  /// a lease_guard::renew() call, failed ones included. Default: nothing. Must not throw.
  virtual void renew_latency(std::chrono::microseconds latency) { (void)latency; }
  /// A renewal failed with a transient error; the watchdog tries again while the lease is valid.
  /// Default: nothing. Must not throw.
  virtual void renew_failed(std::string_view name, const error& cause) { (void)name, (void)cause; }
  /// A lease was found lost (expired, taken over, or force-released). Default: nothing. Must
  /// not throw. (dblock calls lost(), whose default calls this.)
  virtual void lease_lost(std::string_view name, const error& cause) { (void)name, (void)cause; }
  /// A lease was found lost, and why (once per acquisition). Default: lease_lost(name, cause).
  /// Must not throw.
  virtual void lost(std::string_view name, loss_reason reason, const error& cause) {
    (void)reason;
    lease_lost(name, cause);
  }
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
