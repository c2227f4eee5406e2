// dblock: distributed locks and safe concurrent updates on the database you already run.
// A cancellation flag for waits (lease acquire, and any future waiting primitive).
#pragma once

#include <chrono>
#include <memory>

namespace dblock {

namespace detail {
struct cancel_state;
}  // namespace detail

/**
 * @brief A cancellation flag shared by copies; cancel() wakes every wait that watches it.
 *
 * Thread-safety: all members may be called concurrently.
 */
class cancellation {
 public:
  cancellation();
  /// Requests cancellation; waits watching this flag end with errc::cancelled.
  void cancel() noexcept;
  /// True once cancel() was called.
  bool cancelled() const noexcept;
  /// Sleeps up to `d`; returns true early when cancelled.
  bool sleep_for(std::chrono::nanoseconds d) const;

 private:
  std::shared_ptr<detail::cancel_state> state_;
};

}  // namespace dblock
