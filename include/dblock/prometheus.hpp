// dblock: distributed locks and safe concurrent updates on the database you already run.
// Optional: link dblock::prometheus (built when Debian's prometheus-cpp-dev is installed).
#pragma once

#include <memory>
#include <string>

#include "dblock/listener.hpp"

/// @file
/// @brief dblock::prometheus_listener: dblock's events as Prometheus metrics (optional target
/// dblock::prometheus).

namespace prometheus {
class Registry;
}

namespace dblock {

/**
 * @brief A listener that keeps Prometheus metrics of dblock's events.
 *
 * Metrics (all with a `backend` label given at construction):
 * `dblock_acquired_total`, `dblock_acquire_seconds` (histogram), `dblock_contended_total`,
 * `dblock_retries_total`, `dblock_released_total`, `dblock_renew_failures_total`,
 * `dblock_leases_lost_total`, `dblock_rows_reaped_total`.
 * Attach with `database_options::events = std::make_shared<prometheus_listener>(...)`.
 *
 * Thread-safety: all members may be called concurrently (prometheus-cpp's metrics and registry
 * are thread-safe). The hooks never throw.
 */
class prometheus_listener : public listener {
 public:
  /**
   * @brief Registers the metrics in `registry` (which the caller exposes with prometheus-cpp's
   *        Exposer, say, or renders with text()); `registry` must not be null.
   *
   * Two listeners with the same registry and label share their metrics.
   * @throws std::invalid_argument (from prometheus-cpp) when `registry` holds a metric family of
   *         one of these names that cannot be merged: another type, other labels, or a registry
   *         made with InsertBehavior::Throw. Never dblock::error.
   */
  explicit prometheus_listener(std::shared_ptr<prometheus::Registry> registry,
                               const std::string& backend_label = "");
  /// Drops this listener's share of the registry; the metrics stay registered in it. Never
  /// throws.
  ~prometheus_listener() override;

  /// The registry's metrics (all of them, not only dblock's) in the Prometheus text exposition
  /// format. Throws only std::bad_alloc.
  std::string text() const;

  /// Counts `dblock_acquired_total` and observes `latency` in `dblock_acquire_seconds`; never
  /// throws.
  void acquired(std::string_view name, std::int64_t fence,
                std::chrono::microseconds latency) override;
  /// Counts `dblock_contended_total`; never throws.
  void contended(std::string_view name) override;
  /// Counts `dblock_retries_total`; never throws.
  void retried(std::string_view operation, const error& cause) override;
  /// Counts `dblock_released_total`; never throws.
  void released(std::string_view name, std::chrono::microseconds held) override;
  /// Counts `dblock_renew_failures_total`; never throws.
  void renew_failed(std::string_view name, const error& cause) override;
  /// Adds `leases` to `dblock_renewed_total` and `round_trips` to
  /// `dblock_renew_round_trips_total`; never throws.
  void renewed(std::size_t leases, std::size_t round_trips) override;
  /// Counts `dblock_leases_lost_total`; never throws.
  void lease_lost(std::string_view name, const error& cause) override;
  /// Adds `rows` to `dblock_rows_reaped_total`; never throws.
  void rows_reaped(std::uint64_t rows, std::uint64_t batches) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
