// Read-write locks (see rwlock.hpp): the writer is the lease row `name`; readers are permits of
// an internal semaphore. Each side commits its own lease before it reads the other side, so at
// least one of two racing sides sees the other; a writer that sees readers keeps its row (new
// readers back off) and waits for them to leave. Waiting readers join the writer's queue (the
// one waiting engine, lease/queue_wait.hpp): a writer's release rings them, each reader that
// gets in rings the next waiter, and fair mode orders readers and writers together. A writer
// waits for readers to leave in the readers' semaphore's queue, which their releases ring.
#include "dblock/rwlock.hpp"

#include <algorithm>

#include "core/identifier.hpp"
#include "core/no_throw.hpp"
#include "dblock/semaphore.hpp"
#include "lease/lock_impl.hpp"
#include "lease/queue_wait.hpp"
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

  // The readers' semaphore is not fair: readers wait in the writer's queue, whose order `fair`
  // keeps; the semaphore's own queue holds only a writer waiting for readers to leave.
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
  // Fair: only when nobody waits in the writer's queue (readers and writers alike), as a fair
  // lease's try.
  if (impl_->options.fair) {
    impl_->reader_rows();  // a name too long for readers is refused first
    if (detail::queue_wait::first_ticket(detail::access::impl(impl_->db), impl_->name,
                                         impl_->what()))
      return std::nullopt;
  }
  return try_shared(std::string());
}

std::optional<lease_guard> rwlock::try_shared(const std::string& token) {
  // A writer already in: no reader row is taken at all.
  auto& rows = impl_->reader_rows();
  if (impl_->writer_expiry_us >= 0 && impl_->writer_in()) return std::nullopt;
  auto g = token.empty() ? rows.try_acquire() : rows.try_slots(token, 0);
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
  impl_->reader_rows();  // a name too long for readers: refused before any wait
  const auto& dbi = detail::access::impl(impl_->db);
  const std::string timeout_text = "a writer held or waited on it for";
  detail::queue_wait w(dbi, impl_->name, "read " + impl_->what(), impl_->options, deadline, cancel,
                       timeout_text);
  std::optional<lease_guard> got;
  w.run(
      [&](std::int64_t ticket, long long& limit_us) {
        got = try_shared(w.token());
        if (!got) {
          limit_us = impl_->writer_expiry_us;
          return false;
        }
        // In through the queue: readers share, so the next waiter looks now (a reader gets in
        // too; a writer takes the row and waits for the readers to leave).
        if (ticket) detail::queue_wait::ring_head(dbi, impl_->name, w.token());
        return true;
      },
      nullptr);
  return std::move(*got);
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
  lease_guard g = impl_->writer.acquire_until(deadline, cancel);
  if (g.hold_count() > 1) return g;  // reentrant: the readers were drained the first time
  if (!impl_->readers) return g;     // a writer-only name has no readers
  // Holding the writer row: new readers back off. Wait for those already in, in the readers'
  // semaphore's queue, which each reader's release rings (a connection lost or a node that
  // failed over is read again until the deadline; the writer's lease meanwhile stays ours for
  // its TTL).
  const lease_options drain = impl::unfair(impl_->options);
  std::string still_in = "reader(s) still in after";  // the timeout's words, with the count
  for (;;) {
    detail::queue_wait w(detail::access::impl(impl_->db), impl_->readers->queue_name(),
                         "write " + impl_->what(), drain, deadline, cancel, still_in);
    w.run(
        [&](std::int64_t, long long& limit_us) {
          const auto [n, next_expiry_us] = impl_->readers_in();
          still_in = std::to_string(n) + " reader(s) still in after";
          limit_us = next_expiry_us;
          return n == 0;
        },
        nullptr);
    if (g.valid()) return g;
    g = impl_->writer.acquire_until(deadline, cancel);  // it ran out while we waited: again
  }
}

std::optional<lease_guard> rwlock::try_acquire_shared(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire_shared(); });
}

std::optional<lease_guard> rwlock::try_acquire(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire(); });
}

}  // namespace dblock
