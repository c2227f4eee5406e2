// Read-write locks (see rwlock.hpp): the writer is the lease row `name`; readers are permits of
// an internal semaphore. Each side commits its own lease before it reads the other side, so at
// least one of two racing sides sees the other; a writer that sees readers keeps its row (new
// readers back off) and waits for them to leave.
#include "dblock/rwlock.hpp"

#include <algorithm>

#include "core/identifier.hpp"
#include "core/no_throw.hpp"
#include "dblock/semaphore.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/session.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace {

constexpr std::string_view readers_suffix = "R";
// The readers' semaphore name adds U+FFFF "R"; its permits add U+FFFF and up to three digits.
constexpr std::size_t max_rwlock_name_bytes = detail::max_resource_name_bytes -
                                              2 * detail::internal_separator.size() -
                                              readers_suffix.size() - 3;

std::string readers_name(const std::string& name) {
  return name + std::string(detail::internal_separator) + std::string(readers_suffix);
}

// Readers need room for their rows' suffix; a longer name (up to the lock table's 255 bytes) is
// a writer-only lock, so that any lock name works with `dblock exec --lock`.
void validate_reader_name(const std::string& name) {
  detail::validate_resource_name(name);
  if (name.size() > max_rwlock_name_bytes)
    throw error(errc::invalid_argument, "read-write lock name '" + detail::printable(name) +
                                            "' is " + std::to_string(name.size()) +
                                            " bytes: readers need a name of at most " +
                                            std::to_string(max_rwlock_name_bytes));
}

}  // namespace

struct rwlock::impl {
  database db;
  std::string name;
  lease_options options;
  lease_lock writer;
  std::optional<semaphore> readers;  // none for a name too long for reader rows
  long long writer_expiry_us = -1;   // from the last read of the writer row (-1: free)

  impl(database d, std::string n, lease_options o)
      : db(d), name(std::move(n)), options(o), writer(d, name, o) {
    if (name.size() <= max_rwlock_name_bytes)
      readers.emplace(semaphore(d, readers_name(name), max_rwlock_readers, unfair(o),
                                detail::internal_name_t{}));
  }

  // Readers poll (a semaphore refuses `fair`); `fair` orders the writers only.
  static lease_options unfair(lease_options o) {
    o.fair = false;
    return o;
  }

  std::string what() const { return "read-write lock '" + detail::printable(name) + "'"; }

  semaphore& reader_rows() {
    if (!readers) validate_reader_name(name);  // throws: too long for reader rows
    return *readers;
  }
  /// Readers in now, and microseconds until the first of them expires (-1: none).
  std::pair<int, long long> readers_in() {
    return readers ? readers->held_now() : std::make_pair(0, -1LL);
  }

  /// True when a writer holds (or waits on) the writer row now; sets writer_expiry_us.
  bool writer_in() {
    auto row = detail::with_session(
        detail::access::impl(db), "read the writer of " + what(),
        [&](detail::session_scope& s) { return detail::lock_table::read(s, name); });
    const bool in = row && row->hold_count > 0 && row->expires_at_us > row->now_us;
    writer_expiry_us = in ? row->expires_at_us - row->now_us : -1;
    return in;
  }
};

rwlock::rwlock(database db, std::string name, lease_options options) {
  impl_ = std::make_unique<impl>(std::move(db), std::move(name), std::move(options));
}

rwlock::~rwlock() = default;
rwlock::rwlock(rwlock&&) noexcept = default;
rwlock& rwlock::operator=(rwlock&&) noexcept = default;

const std::string& rwlock::name() const noexcept {
  return impl_->name;
}

std::optional<std::pair<std::string, int>> rwlock::reader_of(const std::string& lease_name) {
  auto p = semaphore::permit_of(lease_name);
  if (!p) return std::nullopt;
  const std::string tail = std::string(detail::internal_separator) + std::string(readers_suffix);
  const std::string& sem = p->first;
  if (sem.size() <= tail.size() || sem.compare(sem.size() - tail.size(), tail.size(), tail) != 0)
    return std::nullopt;
  std::string name = sem.substr(0, sem.size() - tail.size());
  if (name.find(detail::internal_separator) != std::string::npos) return std::nullopt;
  return std::make_pair(name, p->second);
}

std::string rwlock::reader_lease_name(const std::string& name, int slot) {
  validate_reader_name(name);
  if (slot < 0 || slot >= max_rwlock_readers)
    throw error(errc::invalid_argument, "no reader " + std::to_string(slot) +
                                            " of read-write lock '" + detail::printable(name) +
                                            "'");
  return detail::permit_lease_name(readers_name(name), slot);
}

std::optional<lease_guard> rwlock::try_acquire_shared() {
  // A writer already in: no reader row is taken at all.
  auto& rows = impl_->reader_rows();
  if (impl_->writer_expiry_us >= 0 && impl_->writer_in()) return std::nullopt;
  auto g = rows.try_acquire();
  if (!g) return std::nullopt;
  // Announced (committed); now the writer side: a writer that holds or waits wins.
  if (impl_->writer_in()) {
    g.reset();  // gives the reader row back (a failure goes to the error handler; it expires)
    return std::nullopt;
  }
  return g;
}

lease_guard rwlock::acquire_shared_until(steady_clock::time_point deadline,
                                         const cancellation& cancel) {
  deadline = std::max(deadline, steady_clock::now());  // time_point::min(): no overflow below
  const auto start = steady::now();
  for (int attempt = 0;; ++attempt) {
    if (cancel.cancelled()) throw error(errc::cancelled, "read " + impl_->what() + ": cancelled");
    if (auto g = try_acquire_shared()) return std::move(*g);
    if (steady::now() >= deadline)
      throw error(errc::timeout, "read " + impl_->what() + ": a writer held or waited on it for " +
                                     detail::wait_text(start, deadline));
    cancel.sleep_for(
        detail::poll_sleep(impl_->options, attempt, impl_->writer_expiry_us, deadline));
  }
}

std::optional<lease_guard> rwlock::try_acquire() {
  auto g = impl_->writer.try_acquire();
  if (!g) return std::nullopt;
  if (g->hold_count() == 1 && impl_->readers_in().first > 0) {
    g.reset();  // readers are in: give the writer row back at once
    return std::nullopt;
  }
  return g;
}

lease_guard rwlock::acquire_until(steady_clock::time_point deadline, const cancellation& cancel) {
  deadline = std::max(deadline, steady_clock::now());  // time_point::min(): no overflow below
  const auto start = steady::now();
  auto left = [&] {
    return std::max(nanoseconds(0),
                    std::chrono::duration_cast<nanoseconds>(deadline - steady::now()));
  };
  lease_guard g = impl_->writer.acquire_until(deadline, cancel);
  if (g.hold_count() > 1) return g;  // reentrant: the readers were drained the first time
  // Holding the writer row: new readers back off. Wait for those already in. The count is a
  // read: a connection lost or a node that failed over is read again until the deadline (the
  // writer's lease meanwhile stays ours for its TTL).
  auto readers_in = [&] {
    for (int failures = 0;; ++failures) {
      try {
        return impl_->readers_in();
      } catch (const error& e) {
        const bool transient =
            e.code() == errc::connection_lost || e.code() == errc::connection_failed;
        if (!transient || steady::now() >= deadline) throw;
        if (cancel.sleep_for(std::min<nanoseconds>(left(), detail::failure_backoff(failures))))
          throw error(errc::cancelled, "write " + impl_->what() + ": cancelled");
      }
    }
  };
  for (int attempt = 0;; ++attempt) {
    const auto [held, next_expiry_us] = readers_in();
    if (held == 0) {
      if (g.valid()) return g;
      g = impl_->writer.acquire_until(deadline, cancel);  // it ran out while we waited: again
      continue;
    }
    if (cancel.cancelled()) throw error(errc::cancelled, "write " + impl_->what() + ": cancelled");
    if (steady::now() >= deadline)
      throw error(errc::timeout, "write " + impl_->what() + ": " + std::to_string(held) +
                                     " reader(s) still in after " +
                                     detail::wait_text(start, deadline));
    cancel.sleep_for(detail::poll_sleep(impl_->options, attempt, next_expiry_us, deadline));
  }
}

std::optional<lease_guard> rwlock::try_acquire_shared(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire_shared(); });
}

std::optional<lease_guard> rwlock::try_acquire(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire(); });
}

}  // namespace dblock
