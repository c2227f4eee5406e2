#include "storage/connection_slots.hpp"

#include <chrono>

namespace dblock::detail {

namespace {

// The slot this thread had last, and of which set (a thread may use several handles: only the
// last one's is remembered).
struct last_slot {
  const connection_slots* of = nullptr;
  std::size_t pos = 0;
};
thread_local last_slot last;

}  // namespace

connection_slots::connection_slots(std::size_t n) : busy_(n, false) {
  sessions_.reserve(n);
  for (std::size_t i = 0; i < n; ++i)
    sessions_.push_back(std::make_unique<soci::session>());
}

bool connection_slots::try_lease(std::size_t& pos, int wait_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  auto free_slot = [&](std::size_t& out) {
    if (last.of == this && last.pos < busy_.size() && !busy_[last.pos]) {
      out = last.pos;
      return true;
    }
    for (std::size_t i = 0; i < busy_.size(); ++i)
      if (!busy_[i]) {
        out = i;
        return true;
      }
    return false;
  };
  std::size_t found = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (!free_slot(found))
    if (freed_.wait_until(lk, until) == std::cv_status::timeout && !free_slot(found)) return false;
  busy_[found] = true;
  last = {this, found};
  pos = found;
  return true;
}

void connection_slots::give_back(std::size_t pos) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    busy_[pos] = false;
  }
  freed_.notify_one();
}

}  // namespace dblock::detail
