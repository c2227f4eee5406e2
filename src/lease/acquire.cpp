// Acquiring a lease: one atomic upsert per try (lock_table::acquire), a lost reply resolved by
// reading the row by owner token after the broken server session was ended, transient conflicts
// retried under a retry_policy, and acquire(wait) polling with reads and full-jitter backoff.
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "core/identifier.hpp"
#include "core/no_throw.hpp"
#include "dblock/retry.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"
#include "storage/wait_queue.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace detail {

// 128 bits from the kernel's CSPRNG (getrandom(2)), one system call per token and nothing kept
// in the process, so a forked child can never repeat its parent's tokens.
// std::random_device was slower than the statement it served: libstdc++ reads it with RDSEED,
// which fails often under load and then spins (`pause`, up to 100 retries) per 32 bits; four of
// those per token cost about 12 % of the client's CPU in the fast lease mode's cycle.
std::string new_owner_token() {
  unsigned char raw[16];
  std::size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No getrandom(2) (a kernel older than 3.17): the device, once per 32 bits.
      static thread_local std::random_device rd;
      for (; got < sizeof raw; got += 4) {
        const std::uint32_t v = rd();
        std::memcpy(raw + got, &v, std::min<std::size_t>(4, sizeof raw - got));
      }
    }
  }
  static const char* hex = "0123456789abcdef";
  std::string out(32, '0');
  for (std::size_t i = 0; i < sizeof raw; ++i) {
    out[2 * i] = hex[raw[i] >> 4];
    out[2 * i + 1] = hex[raw[i] & 15];
  }
  return out;
}

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {0};
    if (gethostname(buf, sizeof buf - 1) != 0) return std::string("unknown");
    return std::string(buf);
  }();
  return name;
}

std::string thread_label() {
  static thread_local const long long tid = static_cast<long long>(::syscall(SYS_gettid));
  return std::to_string(tid);
}

nanoseconds poll_backoff(const lease_options& o, int round) {
  // Doubled in milliseconds and compared before each doubling: no overflow for any duration.
  milliseconds cap = o.poll_initial;
  for (int i = 0; i < round && cap < o.poll_max; ++i)
    cap = cap > o.poll_max / 2 ? o.poll_max : cap * 2;
  return full_jitter(std::min<nanoseconds>(std::max(cap, milliseconds(0)), poll_ceiling(o)));
}

nanoseconds poll_ceiling(const lease_options& o) {
  return std::min<milliseconds>(o.poll_max, std::chrono::hours(24));
}

}  // namespace detail

lease_lock::lease_lock(database db, std::string name, lease_options options)
    : lease_lock(std::move(db), std::move(name), std::move(options), detail::internal_name_t{}) {
  detail::validate_resource_name(impl_->name);
}

lease_lock::lease_lock(database db, std::string name, lease_options options, lease_mode mode)
    : lease_lock(std::move(db), std::move(name), std::move(options)) {
  if (mode != lease_mode::row && mode != lease_mode::session)
    throw error(errc::invalid_argument, "lease_lock: unknown lease_mode");
  impl_->mode = mode;
}

lease_lock::lease_lock(database db, std::string name, lease_options options,
                       const detail::internal_name_t&)
    : impl_(std::make_unique<impl>(std::move(db), std::move(name), std::move(options))) {
  impl_->transient = detail::grant_conflict_policy();
  impl_->transient.on_retry = [dbi = detail::access::impl(impl_->db)](const retry_event& ev) {
    dbi->notify([&](listener& l) { l.retried("acquire lease", ev.cause); });
  };
  detail::validate_lease_name(impl_->name);
  auto& o = impl_->options;
  if (o.ttl < milliseconds(10))
    throw error(errc::invalid_argument, "lease ttl must be at least 10 ms");
  if (o.ttl > std::chrono::hours(24 * 365))
    throw error(errc::invalid_argument, "lease ttl must be at most a year");
  if (o.safety_margin.count() == 0) o.safety_margin = std::max(o.ttl / 10, milliseconds(1));
  if (o.safety_margin < milliseconds(0) || o.safety_margin >= o.ttl)
    throw error(errc::invalid_argument, "lease safety_margin must be in [0, ttl)");
  if (o.poll_initial <= milliseconds(0) || o.poll_max < o.poll_initial)
    throw error(errc::invalid_argument, "lease poll_initial must be > 0 and <= poll_max");
}

lease_lock::~lease_lock() = default;
lease_lock::lease_lock(lease_lock&&) noexcept = default;
lease_lock& lease_lock::operator=(lease_lock&&) noexcept = default;

const std::string& lease_lock::name() const noexcept {
  return impl_->name;
}
const database& lease_lock::db() const noexcept {
  return impl_->db;
}
const lease_options& lease_lock::options() const noexcept {
  return impl_->options;
}
lease_mode lease_lock::mode() const noexcept {
  return impl_->mode;
}

// The upsert may have committed, or may still be running on the server (waiting on a row lock)
// and commit later. End that server session first; then the row tells the outcome for good, and
// we resolve by reading it by owner token.
detail::sent_acquire lease_lock::impl::resolve_lost_reply(const detail::acquire_params& p,
                                                          int expected,
                                                          const detail::session_ref& server,
                                                          const error& cause) {
  const auto& dbi = detail::access::impl(db);
  const std::string what = "acquire lease '" + name + "'";
  const std::string expiry =
      "; owner token " + p.owner_token + " will expire unless renewed (" + cause.what() + ")";
  if (!detail::end_broken_session(dbi, server))
    throw error(errc::in_doubt, what + ": the connection broke after the request was sent and " +
                                    detail::session_not_ended(*dbi) + expiry);
  std::optional<detail::lease_row> row;
  try {
    row = detail::with_session(
        dbi, what + " (resolving a lost reply)",
        [&](detail::session_scope& s) { return detail::lock_table::read(s, name); });
  } catch (const error& e) {
    throw error(errc::in_doubt, what +
                                    ": the connection broke after the request was sent and the "
                                    "outcome could not be read back (" +
                                    e.what() + ")" + expiry);
  }
  const bool ours = row && row->owner_token == p.owner_token && row->expires_at_us > row->now_us;
  if (ours && row->hold_count == expected) return {detail::sent_acquire::acquired, row->fence};
  // Not applied. When nobody else holds the lease, the answer is not "busy": send it again (with
  // the same token, so a late landing of the first one is recognised as ours).
  const bool reentry = expected > 1;
  const bool free = !row || (!ours && row->expires_at_us <= row->now_us) ||
                    (ours && reentry && row->hold_count == expected - 1);
  return {free ? detail::sent_acquire::resend : detail::sent_acquire::held, 0};
}

detail::sent_acquire lease_lock::impl::send(const detail::acquire_params& p, std::int64_t ticket,
                                            bool in_order, int expected, steady::time_point& sent) {
  const auto& dbi = detail::access::impl(db);
  detail::session_ref server;
  sent = steady::now();
  try {
    auto fence =
        detail::with_session(dbi, "acquire lease '" + name + "'", [&](detail::session_scope& s) {
          server = s.server();
          return ticket ? detail::wait_queue::acquire_dequeue(s, p, ticket, in_order)
                        : detail::lock_table::acquire(s, p);
        });
    if (fence) return {detail::sent_acquire::acquired, *fence};
    return {detail::sent_acquire::held, 0};
  } catch (const error& e) {
    if (e.code() == errc::in_doubt)  // the storage layer's message names the write only
      throw error(errc::in_doubt, "acquire lease '" + name + "' (" + e.what() + ")", e.backend(),
                  e.sqlstate(), e.native_code());
    if (e.code() != errc::connection_lost) throw;
    return resolve_lost_reply(p, expected, server, e);
  }
}

namespace detail {
namespace {
// The start of the outermost acquire_call on this thread (nullopt: none runs).
thread_local std::optional<steady::time_point> call_started;
}  // namespace

acquire_call::acquire_call(const std::shared_ptr<database_impl>& db, const std::string& name)
    : db_(db), name_(name), outer_(!call_started) {
  if (outer_) call_started = started_;
}
acquire_call::~acquire_call() {
  if (!outer_) return;
  call_started.reset();
  if (waiting_) db_->notify([&](listener& l) { l.waiting(name_, false); });
}
std::optional<steady::time_point> acquire_call::started_here() {
  return call_started;
}
void acquire_call::refused() {
  if (!outer_ || std::exchange(refused_, true)) return;
  db_->notify([&](listener& l) { l.contended(name_); });
}
void acquire_call::waits() {
  refused();
  if (!outer_ || std::exchange(waiting_, true)) return;
  db_->notify([&](listener& l) { l.waiting(name_, true); });
}
void acquire_call::failed(acquire_failure why) {
  if (!outer_) return;
  db_->notify([&](listener& l) {
    l.acquire_failed(
        name_, why,
        std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - started_));
  });
}

}  // namespace detail

std::optional<lease_guard> lease_lock::impl::attempt(const std::string& token,
                                                     std::int64_t ticket) {
  if (mode == lease_mode::session) return session_attempt();
  const auto& dbi = detail::access::impl(db);
  auto cur = current;
  const bool reentry = cur && cur->holds.load() > 0 && cur->valid();
  detail::acquire_params p;
  p.name = name;
  p.owner_token = reentry ? cur->token : !token.empty() ? token : detail::new_owner_token();
  p.ttl_us = std::chrono::duration_cast<std::chrono::microseconds>(options.ttl).count();
  p.holder_host = detail::host_name();
  p.holder_pid = static_cast<std::int64_t>(::getpid());
  p.holder_thread = detail::thread_label();
  const int expected = reentry ? cur->holds.load() + 1 : 1;
  // Timed from the start of the acquire call it belongs to (a waiting acquire's, a semaphore's).
  const auto started = detail::acquire_call::started_here().value_or(steady::now());
  steady::time_point sent;
  if (reentry) ticket = 0;  // a reentrant hold passes no queue
  const bool in_order = options.fair && ticket != 0;
  detail::sent_acquire out = retry(transient, [&] {
    detail::sent_acquire r{detail::sent_acquire::resend, 0};
    for (int round = 0; round < 8 && r.kind == detail::sent_acquire::resend; ++round)
      r = send(p, ticket, in_order, expected, sent);
    return r;
  });
  // A refusal is reported by the acquire call (acquire_call::refused(): once per call).
  if (out.kind != detail::sent_acquire::acquired) {
    dbi->refused_tries.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  dbi->notify([&](listener& l) {
    l.acquired(name, out.fence,
               std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - started));
  });
  return granted(p, out.fence, sent, reentry);
}

lease_guard lease_lock::impl::granted(const detail::acquire_params& p, std::int64_t fence,
                                      steady::time_point sent, bool reentry) {
  auto cur = current;
  if (reentry && fence == cur->fence) {
    cur->holds.fetch_add(1);
    cur->set_deadline(sent, options.ttl);
    return lease_guard(cur);
  }
  if (reentry) {
    // The row was taken over between our holds (it had expired): the old acquisition is lost.
    cur->mark_lost(error(errc::lease_lost, "lease '" + name + "' expired between reentrant holds"),
                   loss_reason::expired);
  }
  auto s = std::make_shared<detail::lease_state>();
  s->db = detail::access::impl(db);
  s->name = name;
  s->token = p.owner_token;
  s->fence = fence;
  s->ttl = options.ttl;
  s->margin = options.safety_margin;
  s->on_lost = options.on_lost;
  s->on_release_error = options.on_release_error;
  s->holds.store(1);
  s->session_mode = mode == lease_mode::session;
  s->pinned = std::move(pinning);
  if (s->session_mode) s->holder_thread = detail::thread_label();  // for its report (status)
  s->set_deadline(sent, options.ttl);
  s->acquired_at = steady::now();
  s->start_hold();
  if (options.watchdog) s->start_watchdog();
  current = s;
  holder = std::this_thread::get_id();
  s->db->check_ttl(name, options.ttl, options.safety_margin);
  return lease_guard(s);
}

detail::thread_check::thread_check(lease_lock::impl& lk) : lk_(lk) {
  const auto self = std::this_thread::get_id();
  std::thread::id nobody;
  // (A literal: this runs on every acquire, the messages only when thrown.)
  const char* const advice =
      ": a lease_lock is for one thread at a time (reentrancy is per object); give each thread "
      "its own lease_lock, even of the same name, or share a dblock::lockable<lease_lock> "
      "(docs/idioms.md)";
  if (!lk.in_call.compare_exchange_strong(nobody, self))
    throw error(
        errc::invalid_argument,
        "lease '" + lk.name + "': two threads acquire through one lease_lock at once" + advice);
  const auto& cur = lk.current;
  if (cur && cur->holds.load() > 0 && cur->valid() && lk.holder != self) {
    lk.in_call.store(std::thread::id());
    throw error(errc::invalid_argument,
                "lease '" + lk.name +
                    "': acquired again through the lease_lock another thread holds it by" + advice);
  }
}

detail::thread_check::~thread_check() {
  lk_.in_call.store(std::thread::id());
}

std::optional<lease_guard> lease_lock::try_acquire() {
  detail::thread_check entered(*impl_);
  // A grant whose reply came later than this would be invalid on arrival.
  const auto& o = impl_->options;
  const detail::call_deadline bound(
      std::max<milliseconds>(o.ttl - o.safety_margin, std::chrono::seconds(1)),
      std::to_string(
          std::max<milliseconds>(o.ttl - o.safety_margin, std::chrono::seconds(1)).count()) +
          " ms (try_acquire: the lease's TTL less its safety margin)");
  const auto& cur = impl_->current;
  const bool reentry = cur && cur->holds.load() > 0 && cur->valid();
  // Fair: a free lease is taken only when nobody is queued for it (the acquire statement
  // checks, in queue order behind everyone).
  detail::acquire_call call(detail::access::impl(impl_->db), impl_->name);
  return call.run([&] {
    auto g = impl_->options.fair && !reentry
                 ? impl_->attempt(std::string(), detail::wait_queue::behind_everyone)
                 : impl_->attempt();
    if (!g) call.refused();
    return g;
  });
}

std::optional<lease_guard> lease_lock::try_acquire(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_acquire(); });
}

}  // namespace dblock
