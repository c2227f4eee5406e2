// dblock: distributed locks and safe concurrent updates on the database you already run.
// Optional: link dblock::prometheus (built when Debian's prometheus-cpp-dev is installed).
#pragma once

#include <memory>
#include <string>

#include "dblock/listener.hpp"

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
 * `dblock_leases_lost_total`, `dblock_rows_reaped_total`. Thread-safe.
 * Attach with `database_options::events = std::make_shared<prometheus_listener>(...)`.
 */
class prometheus_listener : public listener {
 public:
  /// Registers the metrics in `registry` (which the caller exposes, e.g. with prometheus-cpp's
  /// Exposer, or renders with text()).
  explicit prometheus_listener(std::shared_ptr<prometheus::Registry> registry,
                               const std::string& backend_label = "");
  ~prometheus_listener() override;

  /// The registry's metrics in the Prometheus text exposition format.
  std::string text() const;

  void acquired(std::string_view name, std::int64_t fence,
                std::chrono::microseconds latency) override;
  void contended(std::string_view name) override;
  void retried(std::string_view operation, const error& cause) override;
  void released(std::string_view name, std::chrono::microseconds held) override;
  void renew_failed(std::string_view name, const error& cause) override;
  void lease_lost(std::string_view name, const error& cause) override;
  void rows_reaped(std::uint64_t rows, std::uint64_t batches) override;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
