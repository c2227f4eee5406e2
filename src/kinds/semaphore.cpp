// Semaphores: permits as leases on internal names of the lock table (see semaphore.hpp). All
// exclusion comes from the lease upsert of each permit slot; the declaration table only stops
// two users from disagreeing on N, and the read of held slots only picks which slot to try.
#include "dblock/semaphore.hpp"

#include <algorithm>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/identifier.hpp"
#include "core/no_throw.hpp"
#include "dblock/retry.hpp"
#include "dialect/doorbell.hpp"
#include "lease/lock_impl.hpp"
#include "lease/queue_wait.hpp"
#include "lease/state.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/session.hpp"
#include "storage/wait_queue.hpp"

namespace dblock {

namespace {

// Longest semaphore name: the permit suffix (U+FFFF and up to three digits) fills the rest of
// the lock table's 255 bytes.
constexpr std::size_t max_semaphore_name_bytes =
    detail::max_resource_name_bytes - detail::internal_separator.size() - 3;

std::mt19937_64& rng() {
  static thread_local std::mt19937_64 r(std::random_device{}());
  return r;
}

}  // namespace

struct semaphore::impl {
  database db;
  std::string name;
  int permits = 0;
  lease_options options;
  retry_policy transient;  // deadlocks and busy errors of the declaration, built once
  bool declared = false;
  /// The last read found most permits held: read which are free before trying one.
  bool read_first = false;
  /// From the last read of held permits: microseconds until the first of them expires (-1: no
  /// read yet, or none held).
  long long next_expiry_us = -1;
  /// The queue its waiters join (U+FFFF "Q": no lease row has the name); a permit's release
  /// rings its head.
  std::string queue = name + std::string(detail::queue_suffix);
  /// The options of each permit's lease: never fair (the order is the semaphore queue's).
  lease_options permit_options = {};

  std::string what() const { return "semaphore '" + detail::printable(name) + "'"; }

  /// Declares the count on first use, or checks it against the declared one.
  void declare() {
    if (declared) return;
    const std::string w = "declare " + what();
    const auto n = retry(transient, [&] {
      return detail::with_session(detail::access::impl(db), w, [&](detail::session_scope& s) {
        return detail::semaphore_table::declare(s, name, permits);
      });
    });
    if (!n)
      throw error(errc::backend_error, w + ": its row is missing right after it was declared");
    if (*n != permits)
      throw error(errc::invalid_argument,
                  what() + " was declared with " + std::to_string(*n) + " permits, not " +
                      std::to_string(permits) +
                      " (a semaphore is never resized silently: use the declared count)");
    declared = true;
  }

  /// One try of permit `slot`, with a waiter's owner token and queue ticket (none: a new token).
  std::optional<lease_guard> try_slot(int slot, const std::string& token, std::int64_t ticket) {
    lease_lock lk =
        detail::lease_access::internal(db, detail::permit_lease_name(name, slot), permit_options);
    auto g = token.empty() ? lk.try_acquire() : detail::lease_access::attempt(lk, token, ticket);
    if (g) detail::lease_access::state(*g)->ring_also = queue;  // its release rings the queue
    return g;
  }

  /// True when nobody waits in the queue (a fair try goes only then).
  bool queue_empty() {
    return !detail::queue_wait::first_ticket(detail::access::impl(db), queue, what());
  }

  /// The permit slots held now (one statement), and next_expiry_us.
  std::set<int> read_held() {
    const auto rows = detail::with_session(
        detail::access::impl(db), "read the held permits of " + what(),
        [&](detail::session_scope& s) { return detail::semaphore_table::held(s, name); });
    std::set<int> held;
    long long first = std::numeric_limits<long long>::max();
    for (const auto& r : rows) {
      const int slot = permit_slot_of(r.lease_name);
      if (slot < 0 || slot >= permits) continue;
      held.insert(slot);
      first = std::min<long long>(first, r.expires_in_us);
    }
    next_expiry_us = held.empty() ? -1 : std::max(first, 0LL);
    return held;
  }

  // Checks the arguments; returns the options as lease_lock checks and completes them (a zero
  // safety_margin filled in).
  static lease_options checked(const database& db, const std::string& name, int permits,
                               const lease_options& options) {
    detail::validate_lease_name(name);
    if (name.size() > max_semaphore_name_bytes)
      throw error(errc::invalid_argument,
                  "invalid semaphore name '" + detail::printable(name) +
                      "': " + std::to_string(name.size()) + " bytes, the limit is " +
                      std::to_string(max_semaphore_name_bytes) +
                      " (a permit's lease name adds a suffix; names are never truncated)");
    if (permits < 1 || permits > max_semaphore_permits)
      throw error(errc::invalid_argument,
                  "semaphore '" + detail::printable(name) + "': " + std::to_string(permits) +
                      " permits, expected 1.." + std::to_string(max_semaphore_permits));
    lease_options o =
        detail::lease_access::internal(db, detail::permit_lease_name(name, 0), options).options();
    return o;
  }

  static int permit_slot_of(const std::string& lease_name) {
    const auto pos = lease_name.rfind(detail::internal_separator);
    if (pos == std::string::npos) return -1;
    const std::string digits = lease_name.substr(pos + detail::internal_separator.size());
    if (digits.empty() || digits.size() > 3 ||
        !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return -1;
    return std::stoi(digits);
  }
};

semaphore::semaphore(database db, std::string name, int permits, lease_options options)
    : semaphore(std::move(db), std::move(name), permits, std::move(options),
                detail::internal_name_t{}) {
  // A user's name: U+FFFF (dblock's internal names) refused too.
  detail::validate_resource_name(impl_->name);
}

semaphore::semaphore(database db, std::string name, int permits, lease_options options,
                     const detail::internal_name_t&)
    : impl_(
          std::make_unique<impl>(impl{db, name, permits, impl::checked(db, name, permits, options),
                                      detail::grant_conflict_policy(), false, false, -1})) {
  impl_->permit_options = impl_->options;
  impl_->permit_options.fair = false;
}

std::pair<int, long long> semaphore::held_now() {
  const auto held = impl_->read_held();
  return {static_cast<int>(held.size()), impl_->next_expiry_us};
}

semaphore::~semaphore() = default;
semaphore::semaphore(semaphore&&) noexcept = default;
semaphore& semaphore::operator=(semaphore&&) noexcept = default;

const std::string& semaphore::name() const noexcept {
  return impl_->name;
}
int semaphore::permits() const noexcept {
  return impl_->permits;
}

const std::string& semaphore::queue_name() const noexcept {
  return impl_->queue;
}

int semaphore::permit_slot(const lease_guard& g) {
  return impl::permit_slot_of(g.name());
}

std::string semaphore::permit_lease_name(const std::string& name, int slot) {
  detail::validate_resource_name(name);
  if (name.size() > max_semaphore_name_bytes || slot < 0 || slot >= max_semaphore_permits)
    throw error(errc::invalid_argument, "no permit " + std::to_string(slot) + " of semaphore '" +
                                            detail::printable(name) + "'");
  return detail::permit_lease_name(name, slot);
}

std::optional<std::pair<std::string, int>> semaphore::permit_of(const std::string& lease_name) {
  const int slot = impl::permit_slot_of(lease_name);
  if (slot < 0) return std::nullopt;
  return std::make_pair(lease_name.substr(0, lease_name.rfind(detail::internal_separator)), slot);
}

std::optional<std::string> semaphore::queue_of(const std::string& name) {
  const std::string_view q = detail::queue_suffix;
  if (name.size() <= q.size() || name.compare(name.size() - q.size(), q.size(), q) != 0)
    return std::nullopt;
  return name.substr(0, name.size() - q.size());
}

std::optional<lease_guard> semaphore::try_acquire() {
  // One call for the listener: contended once, however many slots it tried.
  detail::acquire_call call(detail::access::impl(impl_->db), impl_->name);
  return call.run([&] {
    // Fair: only when nobody waits in the queue.
    auto g = impl_->options.fair && !(impl_->declare(), impl_->queue_empty())
                 ? std::nullopt
                 : try_slots(std::string(), 0);
    if (!g) call.refused();
    return g;
  });
}

std::optional<lease_guard> semaphore::try_slots(const std::string& token, std::int64_t ticket) {
  impl_->declare();
  const int n = impl_->permits;
  int probed = -1;
  if (!impl_->read_first) {
    // A random slot first: with a free permit, one statement.
    probed = std::uniform_int_distribution<int>(0, n - 1)(rng());
    if (auto g = impl_->try_slot(probed, token, ticket)) return g;
    if (n == 1) {
      impl_->next_expiry_us = -1;
      return std::nullopt;
    }
  }
  const std::set<int> held = impl_->read_held();
  // Mostly held: next time read first instead of probing blindly (two statements, not three).
  impl_->read_first = held.size() * 2 >= static_cast<std::size_t>(n);
  std::vector<int> free;
  for (int k = 0; k < n; ++k)
    if (k != probed && !held.count(k)) free.push_back(k);
  std::shuffle(free.begin(), free.end(), rng());
  for (const int k : free)
    if (auto g = impl_->try_slot(k, token, ticket)) return g;
  return std::nullopt;
}

lease_guard semaphore::acquire_until(steady_clock::time_point deadline,
                                     const cancellation& cancel) {
  deadline = std::max(deadline, steady_clock::now());  // time_point::min(): no overflow below
  detail::acquire_call call(detail::access::impl(impl_->db), impl_->name);
  return call.run([&] { return wait_until(call, deadline, cancel); });
}

lease_guard semaphore::wait_until(detail::acquire_call& call, steady_clock::time_point deadline,
                                  const cancellation& cancel) {
  // The one waiting engine (lease/queue_wait.hpp): the semaphore's queue, rung by the release of
  // any of its permits.
  impl_->declare();
  const auto& dbi = detail::access::impl(impl_->db);
  const std::string timeout_text = "none within";
  detail::queue_wait w(dbi, impl_->queue, "acquire a permit of " + impl_->what(), impl_->options,
                       deadline, cancel, timeout_text);
  std::optional<lease_guard> got;
  w.run(
      [&](std::int64_t ticket, long long& limit_us) {
        got = try_slots(w.token(), ticket);
        limit_us = impl_->next_expiry_us;
        // The permit's acquire deleted the entry with it, unless the dialect defers that.
        if (got && ticket && !detail::wait_queue::exit_deferred(*dbi)) w.entry_deleted();
        return got.has_value();
      },
      [&] { call.waits(); });
  return std::move(*got);
}

std::optional<lease_guard> semaphore::try_acquire(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire(); });
}

}  // namespace dblock
