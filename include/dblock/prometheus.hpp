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
 * @brief A listener that keeps Prometheus metrics of dblock's events (docs/observability.md
 *        lists each series with an alert rule).
 *
 * Every series has a `backend` label: the one given at construction, or else the backend of
 * the first database handle opened with this listener ("postgresql", "mysql", "sqlite"). For a
 * process with databases of several backends, give each database a listener of its own (on the
 * same registry: the families are shared, the series told apart by the label).
 *
 * Counters: `dblock_acquired_total`, `dblock_contended_total` (acquire calls that found the
 * lease held, once per call), `dblock_acquire_failures_total{reason="timeout|cancelled|error"}`,
 * `dblock_retries_total`, `dblock_released_total`, `dblock_renewed_total`,
 * `dblock_renew_round_trips_total`, `dblock_renew_failures_total`,
 * `dblock_leases_lost_total{reason="expired|taken_over|forced|connection"}`,
 * `dblock_rows_reaped_total`. Histograms: `dblock_acquire_seconds` (whole calls, waits
 * included) and `dblock_hold_seconds` (buckets up to 600 s), `dblock_renew_seconds` (up to
 * 10 s). Gauges: `dblock_leases_held`, `dblock_acquires_waiting`,
 * `dblock_leader{election="..."}` (1 while this process leads it, 0 after).
 *
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
   * @param registry where the metrics live.
   * @param backend_label the `backend` label; empty: the backend of the first database
   *        attached.
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
  /// The `backend` label of this listener's series (empty while it is not known yet: no label
  /// given and no database attached). Throws only std::bad_alloc.
  std::string backend_label() const;

  /// Takes `backend` as the label when none was given and none attached before.
  void attached(std::string_view backend) override;
  /// Counts `dblock_acquired_total` and observes `latency` in `dblock_acquire_seconds`.
  void acquired(std::string_view name, std::int64_t fence,
                std::chrono::microseconds latency) override;
  /// Counts `dblock_contended_total`.
  void contended(std::string_view name) override;
  /// Counts `dblock_acquire_failures_total{reason}`.
  void acquire_failed(std::string_view name, acquire_failure why,
                      std::chrono::microseconds waited) override;
  /// Moves `dblock_acquires_waiting`.
  void waiting(std::string_view name, bool waiting) override;
  /// Moves `dblock_leases_held`.
  void holding(std::string_view name, bool held) override;
  /// Sets `dblock_leader{election}` to 1 or 0.
  void leadership(std::string_view election, bool leader) override;
  /// Counts `dblock_retries_total`.
  void retried(std::string_view operation, const error& cause) override;
  /// Counts `dblock_released_total` and observes `held` in `dblock_hold_seconds`.
  void released(std::string_view name, std::chrono::microseconds held) override;
  /// Observes `latency` in `dblock_renew_seconds`.
  void renew_latency(std::chrono::microseconds latency) override;
  /// Counts `dblock_renew_failures_total`.
  void renew_failed(std::string_view name, const error& cause) override;
  /// Adds `leases` to `dblock_renewed_total` and `round_trips` to
  /// `dblock_renew_round_trips_total`.
  void renewed(std::size_t leases, std::size_t round_trips) override;
  /// Counts `dblock_leases_lost_total{reason}`.
  void lost(std::string_view name, loss_reason reason, const error& cause) override;
  /// Adds `rows` to `dblock_rows_reaped_total`.
  void rows_reaped(std::uint64_t rows, std::uint64_t batches) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
