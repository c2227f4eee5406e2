// Acquiring a lease: one atomic upsert per try (lock_table::acquire), a lost reply resolved by
// reading the row by owner token after the broken server session was ended, transient conflicts
// retried under a retry_policy, and acquire(wait) polling with reads and full-jitter backoff.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <random>

#include "dblock/retry.hpp"
#include "identifier.hpp"
#include "lease/state.hpp"
#include "storage/lock_table.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;
using std::chrono::nanoseconds;

namespace detail {
namespace {

std::string new_owner_token() {
  static thread_local std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 4; ++i) {
    std::uint32_t v = rd();
    for (int k = 0; k < 8; ++k)
      out[i * 8 + k] = hex[(v >> (k * 4)) & 15];
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
  return std::to_string(static_cast<long long>(::syscall(SYS_gettid)));
}

// The outcome of one acquire statement.
struct sent_acquire {
  enum kind_t { acquired, held, resend } kind;
  std::int64_t fence = 0;
};

}  // namespace

nanoseconds full_jitter(nanoseconds cap) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  if (cap.count() <= 0) return nanoseconds(0);
  std::uniform_int_distribution<long long> d(0, cap.count());
  return nanoseconds(d(rng));
}

}  // namespace detail

struct lease_lock::impl {
  database db;
  std::string name;
  lease_options options;
  std::shared_ptr<detail::lease_state> current;  // the acquisition reentry extends
  retry_policy transient;  // deadlocks and busy errors of the upsert itself, built once

  std::optional<lease_guard> attempt();
  detail::sent_acquire send(const detail::acquire_params& p, int expected_holds,
                            steady::time_point& sent);
  detail::sent_acquire resolve_lost_reply(const detail::acquire_params& p, int expected_holds,
                                          const detail::session_ref& server);
  lease_guard granted(const detail::acquire_params& p, std::int64_t fence, steady::time_point sent,
                      bool reentry);
};

lease_lock::lease_lock(database db, std::string name, lease_options options)
    : impl_(std::make_unique<impl>(
          impl{std::move(db), std::move(name), std::move(options), {}, {}})) {
  impl_->transient = detail::transient_conflict_policy(9, milliseconds(256));
  impl_->transient.on_retry = [dbi = detail::access::impl(impl_->db)](const retry_event& ev) {
    dbi->notify([&](listener& l) { l.retried("acquire lease", ev.cause); });
  };
  detail::validate_resource_name(impl_->name);
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

// The upsert may have committed, or may still be running on the server (waiting on a row lock)
// and commit later. End that server session first; then the row tells the outcome for good, and
// we resolve by reading it by owner token.
detail::sent_acquire lease_lock::impl::resolve_lost_reply(const detail::acquire_params& p,
                                                          int expected,
                                                          const detail::session_ref& server) {
  const auto& dbi = detail::access::impl(db);
  const std::string what = "acquire lease '" + name + "'";
  const std::string expiry = "; owner token " + p.owner_token + " will expire unless renewed";
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

detail::sent_acquire lease_lock::impl::send(const detail::acquire_params& p, int expected,
                                            steady::time_point& sent) {
  const auto& dbi = detail::access::impl(db);
  detail::session_ref server;
  sent = steady::now();
  try {
    auto fence =
        detail::with_session(dbi, "acquire lease '" + name + "'", [&](detail::session_scope& s) {
          server = s.server();
          return detail::lock_table::acquire(s, p);
        });
    if (fence) return {detail::sent_acquire::acquired, *fence};
    return {detail::sent_acquire::held, 0};
  } catch (const error& e) {
    if (e.code() != errc::connection_lost) throw;
    return resolve_lost_reply(p, expected, server);
  }
}

std::optional<lease_guard> lease_lock::impl::attempt() {
  const auto& dbi = detail::access::impl(db);
  auto cur = current;
  const bool reentry = cur && cur->holds.load() > 0 && cur->valid();
  detail::acquire_params p;
  p.name = name;
  p.owner_token = reentry ? cur->token : detail::new_owner_token();
  p.ttl_us = std::chrono::duration_cast<std::chrono::microseconds>(options.ttl).count();
  p.holder_host = detail::host_name();
  p.holder_pid = static_cast<std::int64_t>(::getpid());
  p.holder_thread = detail::thread_label();
  const int expected = reentry ? cur->holds.load() + 1 : 1;
  const auto started = steady::now();
  steady::time_point sent;
  detail::sent_acquire out = retry(transient, [&] {
    detail::sent_acquire r{detail::sent_acquire::resend, 0};
    for (int round = 0; round < 8 && r.kind == detail::sent_acquire::resend; ++round)
      r = send(p, expected, sent);
    return r;
  });
  if (out.kind != detail::sent_acquire::acquired) {
    dbi->notify([&](listener& l) { l.contended(name); });
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
    cur->mark_lost(error(errc::lease_lost, "lease '" + name + "' expired between reentrant holds"));
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
  s->set_deadline(sent, options.ttl);
  s->acquired_at = steady::now();
  if (options.watchdog) s->start_watchdog();
  current = s;
  return lease_guard(s);
}

std::optional<lease_guard> lease_lock::try_acquire() {
  return impl_->attempt();
}

namespace {

// What a poll of a held lease decided.
enum class poll_result { try_now, keep_polling };

}  // namespace

lease_guard lease_lock::acquire(milliseconds wait, const cancellation& cancel) {
  const auto& dbi = detail::access::impl(impl_->db);
  const auto& o = impl_->options;
  const std::string what = "acquire lease '" + impl_->name + "'";
  const auto deadline = steady::now() + wait;
  auto cancelled = [&] { return error(errc::cancelled, what + ": cancelled"); };
  bool lost_race = false;  // the last try followed a read that showed the lease free
  int attempt = 0;
  // Held by someone else: poll with reads, not upserts (a failed upsert still writes, and on
  // PostgreSQL flushes, WAL; a read does not), sleeping no longer than the lease has left.
  auto poll = [&]() -> poll_result {
    auto now = steady::now();
    if (now >= deadline)
      throw error(errc::timeout,
                  what + ": not acquired within " + std::to_string(wait.count()) + " ms");
    nanoseconds cap =
        std::min<nanoseconds>(o.poll_initial * (1LL << std::min(attempt, 20)), o.poll_max);
    nanoseconds sleep = std::min<nanoseconds>(detail::full_jitter(cap), deadline - now);
    auto row = detail::with_session(dbi, what, [&](detail::session_scope& s) {
      return detail::lock_table::read(s, impl_->name);
    });
    const bool free = !row || row->hold_count == 0 || row->expires_at_us <= row->now_us;
    if (free && !lost_race) {
      lost_race = true;
      return poll_result::try_now;
    }
    // Free, but the last try after a free read failed (another waiter won): back off before
    // trying again, so that waiters never spin on try and read.
    const bool backing_off = free;
    lost_race = false;
    auto until_expiry =
        backing_off ? sleep
                    : std::chrono::microseconds(row->expires_at_us - row->now_us) + milliseconds(1);
    sleep = std::min<nanoseconds>(sleep, until_expiry);
    if (cancel.sleep_for(sleep)) throw cancelled();
    if (!backing_off && steady::now() - now >= until_expiry) return poll_result::try_now;
    return poll_result::keep_polling;
  };
  for (;; ++attempt) {
    if (cancel.cancelled()) throw cancelled();
    if (auto g = impl_->attempt()) return std::move(*g);
    while (poll() == poll_result::keep_polling)
      ++attempt;
  }
}

}  // namespace dblock
