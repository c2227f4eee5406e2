#include "dblock/cancellation.hpp"

#include "wake/cancel_access.hpp"

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

bool cancel_access::wait(const cancellation& c, std::chrono::nanoseconds d,
                         const std::atomic<bool>& flag) {
  std::unique_lock<std::mutex> lk(c.state_->mu);
  return c.state_->cv.wait_for(lk, d, [&] { return flag.load() || c.state_->cancelled.load(); }) &&
         flag.load();
}

void cancel_access::poke(const cancellation& c) {
  { std::lock_guard<std::mutex> lk(c.state_->mu); }
  c.state_->cv.notify_all();
}

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
