#include "dblock/cancellation.hpp"

#include "dblock/deadline.hpp"

#include "core/cancel_access.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <vector>

namespace dblock {
namespace detail {

struct cancel_state {
  mutable std::mutex mu;
  mutable std::condition_variable cv;  // sleep_for()
  std::atomic<bool> cancelled{false};
  std::vector<wake_slot*> slots;  // guarded by mu: the slots sleeping in cancel_access::wait()
};

// Lock order: cancel_state::mu before wake_slot::mu; a sleeper never holds its slot's mutex while
// it takes the state's, and a slot stays registered (alive) while cancel() notifies it.
bool cancel_access::wait(const cancellation& c, std::chrono::nanoseconds d,
                         const std::atomic<bool>& flag, wake_slot& slot) {
  cancel_state& st = *c.state_;
  {
    std::lock_guard<std::mutex> l(st.mu);
    st.slots.push_back(&slot);
  }
  bool woken = false;
  {
    std::unique_lock<std::mutex> lk(slot.mu);
    // wait_until a saturated deadline: wait_for(d) computes now + d, which overflows for the
    // time left of a wait for ever (UBSan).
    woken = slot.cv.wait_until(lk, deadline_after(d), [&] {
      return flag.load() || st.cancelled.load();
    }) && flag.load();
  }
  std::lock_guard<std::mutex> l(st.mu);
  st.slots.erase(std::find(st.slots.begin(), st.slots.end(), &slot));
  return woken;
}

void cancel_access::poke(wake_slot& slot) {
  { std::lock_guard<std::mutex> lk(slot.mu); }
  slot.cv.notify_all();
}

const cancellation& cancel_access::fired() {
  static const cancellation c = [] {
    cancellation f;
    f.cancel();
    return f;
  }();
  return c;
}

}  // namespace detail

cancellation::cancellation() : state_(std::make_shared<detail::cancel_state>()) {}

void cancellation::cancel() noexcept {
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->cancelled = true;
  state_->cv.notify_all();
  for (detail::wake_slot* s : state_->slots)
    detail::cancel_access::poke(*s);
}

bool cancellation::cancelled() const noexcept {
  return state_->cancelled.load();
}

bool cancellation::sleep_for(std::chrono::nanoseconds d) const {
  std::unique_lock<std::mutex> lk(state_->mu);
  return state_->cv.wait_until(lk, deadline_after(d), [this] { return state_->cancelled.load(); });
}

}  // namespace dblock
