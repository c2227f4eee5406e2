// Lock sets: several leases (lease_lock) taken in one global order, all or nothing (see
// lock_set.hpp). No storage of its own: each name is an ordinary lease row, and the set's fenced
// write checks every row in one write transaction.
#include "dblock/lock_set.hpp"

#include <algorithm>

#include "core/cancel_access.hpp"
#include "core/identifier.hpp"
#include "core/no_throw.hpp"
#include "lease/fenced.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;

// ---- lock_set_guard ----------------------------------------------------------------------------

lock_set_guard::lock_set_guard(std::vector<lease_guard> leases, std::vector<std::string> names)
    : leases_(std::move(leases)), names_(std::move(names)) {}

lock_set_guard::lock_set_guard(lock_set_guard&& other) noexcept
    : leases_(std::move(other.leases_)),
      names_(std::move(other.names_)),
      lost_(std::move(other.lost_)),
      lost_tied_(other.lost_tied_) {
  other.leases_.clear();
  other.names_.clear();
  other.lost_tied_ = false;
}

lock_set_guard& lock_set_guard::operator=(lock_set_guard&& other) noexcept {
  if (this != &other) {
    release_all_quietly();
    leases_ = std::move(other.leases_);
    names_ = std::move(other.names_);
    lost_ = std::move(other.lost_);
    lost_tied_ = other.lost_tied_;
    other.leases_.clear();
    other.names_.clear();
    other.lost_tied_ = false;
  }
  return *this;
}

lock_set_guard::~lock_set_guard() {
  release_all_quietly();
}

void lock_set_guard::release_all_quietly() noexcept {
  // Each lease_guard's destructor releases it and reports a failure to its handler; last
  // taken, first released.
  while (!leases_.empty())
    leases_.pop_back();
  names_.clear();
}

std::size_t lock_set_guard::size() const noexcept {
  return leases_.size();
}

const std::vector<lease_guard>& lock_set_guard::leases() const noexcept {
  return leases_;
}

const lease_guard& lock_set_guard::lease(const std::string& name) const {
  auto it = std::lower_bound(names_.begin(), names_.end(), name);
  if (it == names_.end() || *it != name)
    throw error(errc::invalid_argument,
                "lock set: '" + detail::printable(name) + "' is not one of the set's names");
  return leases_[static_cast<std::size_t>(it - names_.begin())];
}

std::int64_t lock_set_guard::fence(const std::string& name) const {
  return lease(name).fence();
}

cancellation lock_set_guard::lost() const {
  if (leases_.empty()) return detail::cancel_access::fired();
  if (!lost_tied_) {
    for (const auto& g : leases_) {
      const auto& st = detail::lease_access::state(g);
      st->end_signal();
      st->also_end(lost_);
    }
    lost_tied_ = true;
  }
  return lost_;
}

bool lock_set_guard::valid() const noexcept {
  if (leases_.empty()) return false;
  return std::all_of(leases_.begin(), leases_.end(),
                     [](const lease_guard& g) { return g.valid(); });
}

milliseconds lock_set_guard::remaining() const noexcept {
  if (leases_.empty()) return milliseconds(0);
  milliseconds least = milliseconds::max();
  for (const auto& g : leases_)
    least = std::min(least, g.remaining());
  return least;
}

void lock_set_guard::release() {
  if (leases_.empty()) throw error(errc::not_owner, "release: the lock set guard holds no lease");
  std::vector<lease_guard> leases = std::move(leases_);
  leases_.clear();
  names_.clear();
  std::optional<error> first;
  while (!leases.empty()) {
    lease_guard g = std::move(leases.back());
    leases.pop_back();
    try {
      g.release();
    } catch (const error& e) {
      if (!first) first = e;
    }
  }
  if (first) throw *first;
}

void lock_set_guard::fenced(const std::function<void(soci::session&)>& write) {
  if (leases_.empty())
    throw error(errc::not_owner, "fenced write: the lock set guard holds no lease");
  // Every lock row locked and checked in the set's order (the order every set takes).
  std::vector<detail::lease_state*> states;
  for (const auto& g : leases_)
    states.push_back(detail::lease_access::state(g).get());
  detail::fenced_user_write(
      states, write,
      "fenced write under a lock set of " + std::to_string(leases_.size()) + " leases");
}

// ---- lock_set ----------------------------------------------------------------------------------

struct lock_set::impl {
  std::vector<std::string> names;
  std::vector<lease_lock> locks;  // one per name, in the same order

  /// Gives up the leases in `held` (last first) and starts over.
  static void drop(std::vector<lease_guard>& held) {
    while (!held.empty())
      held.pop_back();
  }

  /// The set's guard, or nothing (every lease dropped) when a lease taken early is no longer
  /// valid now that the last one is held.
  std::optional<lock_set_guard> complete(std::vector<lease_guard>& held) {
    const bool all_valid =
        std::all_of(held.begin(), held.end(), [](const lease_guard& g) { return g.valid(); });
    if (!all_valid) {
      drop(held);
      return std::nullopt;
    }
    return lock_set_guard(std::move(held), names);
  }
};

lock_set::lock_set(database db, std::vector<std::string> names, lease_options options)
    : impl_(std::make_unique<impl>()) {
  if (names.empty()) throw error(errc::invalid_argument, "lock set: no names given");
  // Byte order: std::string compares chars as unsigned, like the database's binary collation.
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  if (names.size() > max_lock_set_names)
    throw error(errc::invalid_argument, "lock set: " + std::to_string(names.size()) +
                                            " names, at most " +
                                            std::to_string(max_lock_set_names) + " allowed");
  impl_->locks.reserve(names.size());
  for (const auto& n : names) {
    try {
      impl_->locks.emplace_back(db, n, options);
    } catch (const error& e) {
      if (e.code() != errc::invalid_argument) throw;
      throw error(errc::invalid_argument,
                  "lock set: name '" + detail::printable(n) + "': " + e.what());
    }
  }
  impl_->names = std::move(names);
}

lock_set::~lock_set() = default;
lock_set::lock_set(lock_set&&) noexcept = default;
lock_set& lock_set::operator=(lock_set&&) noexcept = default;

const std::vector<std::string>& lock_set::names() const noexcept {
  return impl_->names;
}

std::optional<lock_set_guard> lock_set::try_acquire() {
  std::vector<lease_guard> held;
  held.reserve(impl_->locks.size());
  try {
    for (auto& l : impl_->locks) {
      auto g = l.try_acquire();
      if (!g) {
        impl::drop(held);
        return std::nullopt;
      }
      held.push_back(std::move(*g));
    }
  } catch (...) {
    impl::drop(held);
    throw;
  }
  return impl_->complete(held);
}

lock_set_guard lock_set::acquire_until(steady_clock::time_point deadline,
                                       const cancellation& cancel) {
  const auto start = steady::now();
  for (;;) {
    std::vector<lease_guard> held;
    held.reserve(impl_->locks.size());
    try {
      for (auto& l : impl_->locks)
        held.push_back(l.acquire_until(deadline, cancel));
    } catch (const error& e) {
      impl::drop(held);
      if (e.code() != errc::timeout) throw;
      throw error(errc::timeout, "lock set: " + std::string(e.what()) + " (" +
                                     std::to_string(impl_->names.size()) +
                                     " names, none of them kept)");
    } catch (...) {
      impl::drop(held);
      throw;
    }
    if (auto g = impl_->complete(held)) return std::move(*g);
    if (steady::now() >= deadline)
      throw error(errc::timeout, "lock set: not every lease was valid at once within " +
                                     detail::wait_text(start, deadline));
  }
}

std::optional<lock_set_guard> lock_set::try_acquire(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire(); });
}

}  // namespace dblock
