#include "workload_lock.hpp"

#include <stdexcept>

namespace dblock::test::faults {

workload_lock::workload_lock(const database& db, const std::string& kind, const std::string& name,
                             const lease_options& o, const std::string& identity) {
  if (kind == "lease") {
    lease_.emplace(db, name, o);
    row_ = name;
  } else if (kind == "semaphore") {
    sem_.emplace(db, name, 1, o);
    row_ = semaphore::permit_lease_name(name, 0);
  } else if (kind == "election") {
    election_.emplace(db, name, identity, o);
    row_ = election::lease_name(name);
  } else {
    throw std::invalid_argument("workload_lock: unknown kind '" + kind + "'");
  }
}

std::optional<workload_hold> workload_lock::try_acquire() {
  if (election_) {
    auto l = election_->try_campaign();
    if (!l) return std::nullopt;
    return workload_hold(std::move(*l));
  }
  auto g = sem_ ? sem_->try_acquire() : lease_->try_acquire();
  if (!g) return std::nullopt;
  return workload_hold(std::move(*g));
}

workload_hold workload_lock::acquire(std::chrono::milliseconds wait, const cancellation& cancel) {
  if (election_) return workload_hold(election_->campaign(wait, cancel));
  return workload_hold(sem_ ? sem_->acquire(wait, cancel) : lease_->acquire(wait, cancel));
}

}  // namespace dblock::test::faults
