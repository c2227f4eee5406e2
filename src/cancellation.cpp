#include "dblock/cancellation.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace dblock {
namespace detail {

struct cancel_state {
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::atomic<bool> cancelled{false};
};

}  // namespace detail

cancellation::cancellation() : state_(std::make_shared<detail::cancel_state>()) {}

void cancellation::cancel() noexcept {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->cancelled = true;
  }
  state_->cv.notify_all();
}

bool cancellation::cancelled() const noexcept {
  return state_->cancelled.load();
}

bool cancellation::sleep_for(std::chrono::nanoseconds d) const {
  std::unique_lock<std::mutex> lk(state_->mu);
  return state_->cv.wait_for(lk, d, [this] { return state_->cancelled.load(); });
}

}  // namespace dblock
