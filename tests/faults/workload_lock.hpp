// The fault workloads' lock, whatever its kind: a plain lease, the one permit of a semaphore of
// 1, or a leadership of an election. Each kind is mutually exclusive, fenced and renewable, so
// the same workloads and the same analysis check all of them.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "dblock/dblock.hpp"

namespace dblock::test::faults {

/// One hold of a workload_lock.
class workload_hold {
 public:
  explicit workload_hold(lease_guard g) : guard_(std::move(g)) {}
  explicit workload_hold(leadership l) : leader_(std::move(l)) {}
  std::int64_t fence() const { return leader_ ? leader_->fence() : guard_->fence(); }
  std::string owner_token() const {
    return leader_ ? leader_->lease().owner_token() : guard_->owner_token();
  }
  bool valid() const { return leader_ ? leader_->valid() : guard_->valid(); }
  void fenced(const std::function<void(soci::session&)>& write) {
    if (leader_)
      leader_->fenced(write);
    else
      guard_->fenced(write);
  }
  /// release() or resign().
  void release() {
    if (leader_)
      leader_->resign();
    else
      guard_->release();
  }

 private:
  std::optional<lease_guard> guard_;
  std::optional<leadership> leader_;
};

/// A lock of kind "lease", "semaphore" (the one permit of a semaphore of 1 named `name`) or
/// "election" (the leadership of the election `name`; identity `identity`).
class workload_lock {
 public:
  workload_lock(const database& db, const std::string& kind, const std::string& name,
                const lease_options& o, const std::string& identity = "worker");
  std::optional<workload_hold> try_acquire();
  workload_hold acquire(std::chrono::milliseconds wait, const cancellation& cancel = {});
  /// The name of the lease row that the hold is (for row checks).
  const std::string& row_name() const { return row_; }

 private:
  std::optional<lease_lock> lease_;
  std::optional<semaphore> sem_;
  std::optional<election> election_;
  std::string row_;
};

}  // namespace dblock::test::faults
