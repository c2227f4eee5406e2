#include "dblock/lease_lock.hpp"

#include <soci/soci.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "database_impl.hpp"
#include "identifier.hpp"

namespace dblock {

using std::chrono::milliseconds;
using std::chrono::nanoseconds;
using steady = std::chrono::steady_clock;

namespace detail {

struct cancel_state {
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::atomic<bool> cancelled{false};
};

namespace {

std::mutex handler_mu;
std::function<void(const error&)>& default_handler() {
  static std::function<void(const error&)> h;
  return h;
}

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

std::mt19937_64& jitter_rng() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

// Uniform in [0, cap]: "full jitter".
nanoseconds full_jitter(nanoseconds cap) {
  if (cap.count() <= 0) return nanoseconds(0);
  std::uniform_int_distribution<long long> d(0, cap.count());
  return nanoseconds(d(jitter_rng()));
}

}  // namespace

namespace {

bool transient_write_conflict(errc c) {
  return c == errc::deadlock || c == errc::serialization_failure || c == errc::lock_not_available;
}

}  // namespace

/// One acquisition: shared by its guards (reentrant holds) and its watchdog.
struct lease_state : std::enable_shared_from_this<lease_state> {
  std::shared_ptr<database_impl> db;
  std::string name;
  std::string token;
  std::int64_t fence = 0;
  milliseconds ttl;
  milliseconds margin;
  std::function<void(const error&)> on_lost;
  std::function<void(const error&)> on_release_error;

  std::atomic<steady::rep> deadline{0};  // steady clock ticks; local validity ends here
  steady::time_point acquired_at;        // when the acquisition succeeded (for metrics)
  std::atomic<bool> lost{false};
  std::atomic<int> holds{0};

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread watchdog;

  void set_deadline(steady::time_point sent, milliseconds lease) {
    deadline.store((sent + lease - margin).time_since_epoch().count());
  }
  steady::time_point deadline_tp() const {
    return steady::time_point(steady::duration(deadline.load()));
  }
  bool valid() const { return !lost.load() && steady::now() < deadline_tp(); }

  void mark_lost(const error& why) {
    if (lost.exchange(true)) return;
    db->notify([&](listener& l) { l.lease_lost(name, why); });
    if (on_lost) {
      try {
        on_lost(why);
      } catch (...) {
      }
    }
  }

  // Returns true when renewed; false when the lease is gone.
  bool renew_sql(milliseconds lease) {
    auto sent = steady::now();
    bool ok = with_session(db, "renew lease '" + name + "'", [&](soci::session& sql) {
      return db->dia->lease_renew(
          sql, db->tables, name, token, fence,
          std::chrono::duration_cast<std::chrono::microseconds>(lease).count());
    });
    if (ok) set_deadline(sent, lease);
    return ok;
  }

  void start_watchdog() {
    // The thread keeps the state alive: it may outlive every guard when it is detached from
    // inside the on_lost callback.
    watchdog = std::thread([self = shared_from_this()] { self->watchdog_loop(); });
  }

  // Runs one renewal on a helper thread and waits no longer than the local validity: a renewal
  // stuck behind a row lock, a busy pool or a dead connection must not delay the loss report.
  // Returns the renewal's outcome, or nothing when the validity ran out first (the renewal may
  // still land later and extend the lease once; nobody renews it after that).
  std::optional<bool> renew_bounded(std::optional<error>& failure) {
    struct outcome {
      std::mutex m;
      std::condition_variable cv;
      bool done = false;
      bool ok = false;
      std::optional<error> err;
    };
    auto out = std::make_shared<outcome>();
    std::thread([self = shared_from_this(), out] {
      bool ok = false;
      std::optional<error> err;
      try {
        ok = self->renew_sql(self->ttl);
      } catch (const error& e) {
        err = e;
      } catch (const std::exception& e) {
        err = error(errc::backend_error, std::string("renew: ") + e.what());
      }
      {
        std::lock_guard<std::mutex> g(out->m);
        out->done = true;
        out->ok = ok;
        out->err = err;
      }
      out->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> l(out->m);
    if (!out->cv.wait_until(l, deadline_tp(), [&] { return out->done; })) return std::nullopt;
    failure = out->err;
    return out->ok;
  }

  void watchdog_loop() {
    const milliseconds interval = std::max(ttl / 3, milliseconds(1));
    milliseconds wait = interval;
    std::unique_lock<std::mutex> lk(mu);
    while (!stop) {
      if (cv.wait_for(lk, wait, [this] { return stop; })) break;
      lk.unlock();
      wait = interval;
      std::optional<error> failure;
      std::optional<bool> renewed = renew_bounded(failure);
      if (!renewed) {
        mark_lost(error(errc::lease_lost, "lease '" + name +
                                              "': a renewal did not complete before the local "
                                              "validity ran out; watchdog stopped"));
        lk.lock();
        break;
      }
      try {
        if (failure) throw *failure;
        if (!*renewed) {
          mark_lost(error(errc::lease_lost,
                          "lease '" + name + "' expired or was taken over; watchdog stopped"));
          lk.lock();
          break;
        }
      } catch (const error& e) {
        db->notify([&](listener& l) { l.renew_failed(name, e); });
        // Transient failure: retry soon, but give up (and say so) before the local validity
        // ends, so the loss is reported before the lease can have expired.
        milliseconds retry = std::max(std::min(interval / 4, milliseconds(250)), milliseconds(1));
        if (steady::now() + retry >= deadline_tp()) {
          mark_lost(error(errc::lease_lost, "lease '" + name +
                                                "' could not be renewed before its validity ran "
                                                "out: " +
                                                e.what()));
          lk.lock();
          break;
        }
        wait = retry;
      }
      lk.lock();
    }
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) {
      if (watchdog.get_id() == std::this_thread::get_id())
        watchdog.detach();  // released from the on_lost callback itself
      else
        watchdog.join();
    }
  }

  // Releases one hold; throws lease_lost when the lease was no longer ours.
  void release_one() {
    int left = holds.fetch_sub(1) - 1;
    auto report_released = [&] {
      db->notify([&](listener& l) {
        l.released(name, std::chrono::duration_cast<std::chrono::microseconds>(steady::now() -
                                                                               acquired_at));
      });
    };
    if (left == 0) stop_watchdog();
    const std::string what = "release lease '" + name + "'";
    bool in_doubt = false;
    bool released = false;
    for (int attempt = 0; attempt < 3 && !released; ++attempt) {
      session_ref sess;
      try {
        released = with_session(db, what, [&](soci::session& sql) {
          sess = session_of(sql);
          return db->dia->lease_release(sql, db->tables, name, token, fence);
        });
        break;
      } catch (const error& e) {
        if (e.code() == errc::connection_lost) {
          // The server may still apply it later: end that session first (see attempt()).
          if (!end_broken_session(db, sess))
            throw error(errc::in_doubt, what +
                                            ": the connection broke and the server session "
                                            "could not be confirmed ended");
          // The UPDATE may have been applied: never repeat it blindly (with reentrant holds a
          // repeat would drop a hold that is still in use). Read the row back and decide.
          in_doubt = true;
          std::optional<lease_row> row;
          try {
            row = with_session(db, what, [&](soci::session& sql) {
              return db->dia->lease_read(sql, db->tables, name);
            });
          } catch (const error& e2) {
            if (e2.code() == errc::connection_lost && attempt < 2) continue;
            throw error(errc::in_doubt, what +
                                            ": the connection broke and the outcome could "
                                            "not be read back: " +
                                            e2.what());
          }
          const bool ours = row && row->owner_token == token && row->fence == fence;
          if (ours && row->hold_count == left) {
            released = true;  // it was applied
            break;
          }
          if (ours && row->hold_count == left + 1 && row->expires_at_us > row->now_us)
            continue;  // it was not applied: send it again
          break;       // no longer ours: handled below
        }
        if (transient_write_conflict(e.code()) && attempt < 2) continue;
        throw;
      }
    }
    if (released) {
      report_released();
      return;
    }
    // Not matched: already released by an earlier attempt whose reply was lost, or lost.
    auto row = with_session(
        db, what, [&](soci::session& sql) { return db->dia->lease_read(sql, db->tables, name); });
    if (row && row->owner_token == token && row->fence == fence && row->hold_count == left) {
      report_released();  // an earlier attempt whose reply was lost did it
      return;
    }
    if (in_doubt && (!row || row->owner_token != token)) {
      // Our release may have gone through before someone else took the free lease; either way
      // the lease is no longer ours and the successor's row was not touched.
      report_released();
      return;
    }
    mark_lost(error(errc::lease_lost, "lease '" + name + "' was lost before release"));
    throw error(errc::lease_lost, "lease '" + name +
                                      "' had expired or been taken over before release; the "
                                      "successor's row was left untouched");
  }
};

}  // namespace detail

// ---- cancellation ------------------------------------------------------------------------------

cancellation::cancellation() : state_(std::make_shared<detail::cancel_state>()) {}
void cancellation::cancel() noexcept {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->cancelled = true;
  }
  state_->cv.notify_all();
}
bool cancellation::cancelled() const noexcept {
  return state_->cancelled.load();
}
bool cancellation::sleep_for(nanoseconds d) const {
  std::unique_lock<std::mutex> lk(state_->mu);
  return state_->cv.wait_for(lk, d, [this] { return state_->cancelled.load(); });
}

void set_default_error_handler(std::function<void(const error&)> handler) {
  std::lock_guard<std::mutex> lk(detail::handler_mu);
  detail::default_handler() = std::move(handler);
}

// ---- lease_lock --------------------------------------------------------------------------------

struct lease_lock::impl {
  database db;
  std::string name;
  lease_options options;
  std::shared_ptr<detail::lease_state> current;  // the acquisition reentry extends

  std::optional<lease_guard> attempt();
};

lease_lock::lease_lock(database db, std::string name, lease_options options)
    : impl_(std::make_unique<impl>(impl{std::move(db), std::move(name), std::move(options), {}})) {
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

std::optional<lease_guard> lease_lock::impl::attempt() {
  const auto& dbi = db.impl();
  const auto& o = options;
  auto cur = current;
  const bool reentry = cur && cur->holds.load() > 0 && cur->valid();

  detail::acquire_params p;
  p.name = name;
  p.owner_token = reentry ? cur->token : detail::new_owner_token();
  p.ttl_us = std::chrono::duration_cast<std::chrono::microseconds>(o.ttl).count();
  p.holder_host = detail::host_name();
  p.holder_pid = static_cast<std::int64_t>(::getpid());
  p.holder_thread = detail::thread_label();
  const std::string what = "acquire lease '" + name + "'";

  std::optional<std::int64_t> fence;
  steady::time_point sent;
  detail::session_ref sess;
  const auto started = steady::now();
  for (int attempt = 0;; ++attempt) {
    sent = steady::now();
    try {
      fence = detail::with_session(dbi, what, [&](soci::session& sql) {
        sess = detail::session_of(sql);
        return dbi->dia->lease_acquire(sql, dbi->tables, p);
      });
      break;
    } catch (const error& e) {
      if (detail::transient_write_conflict(e.code()) && attempt < 8) {
        dbi->notify([&](listener& l) { l.retried("acquire lease", e); });
        // A deadlock or busy error of the upsert itself (for example MariaDB's hot-key
        // deadlock against a concurrent release) says nothing about the lock: try again.
        std::this_thread::sleep_for(detail::full_jitter(milliseconds(1) * (1 << attempt)));
        continue;
      }
      if (e.code() != errc::connection_lost) throw;
      // The upsert may have committed, or may still be running on the server (waiting on a row
      // lock) and commit later. End that server session first; then the row tells the outcome
      // for good, and we resolve by reading it by owner token.
      if (!detail::end_broken_session(dbi, sess))
        throw error(errc::in_doubt, what +
                                        ": the connection broke after the request was sent and "
                                        "the server session could not be confirmed ended; owner "
                                        "token " +
                                        p.owner_token + " will expire unless renewed");
      std::optional<detail::lease_row> row;
      try {
        row = detail::with_session(
            dbi, what + " (resolving a lost reply)",
            [&](soci::session& sql) { return dbi->dia->lease_read(sql, dbi->tables, name); });
      } catch (const error& e2) {
        throw error(errc::in_doubt, what +
                                        ": the connection broke after the request was sent "
                                        "and the outcome could not be read back (" +
                                        e2.what() + "); owner token " + p.owner_token +
                                        " will expire unless renewed");
      }
      const int expected = reentry ? cur->holds.load() + 1 : 1;
      const bool ours =
          row && row->owner_token == p.owner_token && row->expires_at_us > row->now_us;
      if (ours && row->hold_count == expected) {
        fence = row->fence;  // it was applied
        break;
      }
      // Not applied. When nobody else holds the lease, the answer is not "busy": send it again
      // (with the same token, so a late landing of the first one is recognised as ours).
      const bool free = !row || (!ours && row->expires_at_us <= row->now_us) ||
                        (ours && reentry && row->hold_count == expected - 1);
      if (free && attempt < 8) continue;
      break;
    }
  }
  if (!fence) {
    dbi->notify([&](listener& l) { l.contended(name); });
    return std::nullopt;
  }
  dbi->notify([&](listener& l) {
    l.acquired(name, *fence,
               std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - started));
  });

  if (reentry && *fence == cur->fence) {
    cur->holds.fetch_add(1);
    cur->set_deadline(sent, o.ttl);
    return lease_guard(cur);
  }
  if (reentry) {
    // The row was taken over between our holds (it had expired): the old acquisition is lost.
    cur->mark_lost(error(errc::lease_lost, "lease '" + name + "' expired between reentrant holds"));
  }
  auto s = std::make_shared<detail::lease_state>();
  s->db = dbi;
  s->name = name;
  s->token = p.owner_token;
  s->fence = *fence;
  s->ttl = o.ttl;
  s->margin = o.safety_margin;
  s->on_lost = o.on_lost;
  s->on_release_error = o.on_release_error;
  s->holds.store(1);
  s->set_deadline(sent, o.ttl);
  s->acquired_at = steady::now();
  if (o.watchdog) s->start_watchdog();
  current = s;
  return lease_guard(s);
}

std::optional<lease_guard> lease_lock::try_acquire() {
  return impl_->attempt();
}

lease_guard lease_lock::acquire(milliseconds wait, const cancellation& cancel) {
  const auto& dbi = impl_->db.impl();
  const auto& o = impl_->options;
  const auto deadline = steady::now() + wait;
  bool lost_race = false;  // the last try followed a read that showed the lease free
  for (int attempt = 0;; ++attempt) {
    if (cancel.cancelled())
      throw error(errc::cancelled, "acquire lease '" + impl_->name + "': cancelled");
    if (auto g = impl_->attempt()) return std::move(*g);
    // Held by someone else. Poll with reads, not upserts: a failed upsert still writes (and on
    // PostgreSQL flushes) WAL, a read does not. Sleep no longer than the current lease has left.
    for (;; ++attempt) {
      auto now = steady::now();
      if (now >= deadline)
        throw error(errc::timeout, "acquire lease '" + impl_->name + "': not acquired within " +
                                       std::to_string(wait.count()) + " ms");
      nanoseconds cap = o.poll_initial * (1LL << std::min(attempt, 20));
      cap = std::min<nanoseconds>(cap, o.poll_max);
      nanoseconds sleep = detail::full_jitter(cap);
      auto row = detail::with_session(
          dbi, "acquire lease '" + impl_->name + "'",
          [&](soci::session& sql) { return dbi->dia->lease_read(sql, dbi->tables, impl_->name); });
      bool free = !row || row->hold_count == 0 || row->expires_at_us <= row->now_us;
      if (free && lost_race) {
        // Free, but the last try after a free read failed (another waiter won): back off
        // before trying again, so that waiters never spin on try and read.
        sleep = std::min<nanoseconds>(sleep, deadline - now);
        if (cancel.sleep_for(sleep))
          throw error(errc::cancelled, "acquire lease '" + impl_->name + "': cancelled");
        lost_race = false;
        continue;
      }
      if (free) {
        lost_race = true;
        break;
      }
      lost_race = false;
      auto until_expiry =
          std::chrono::microseconds(row->expires_at_us - row->now_us) + milliseconds(1);
      sleep = std::min<nanoseconds>(sleep, until_expiry);
      sleep = std::min<nanoseconds>(sleep, deadline - now);
      if (cancel.sleep_for(sleep))
        throw error(errc::cancelled, "acquire lease '" + impl_->name + "': cancelled");
      if (steady::now() - now >= until_expiry) break;  // it should have expired: try now
    }
  }
}

// ---- lease_guard -------------------------------------------------------------------------------

lease_guard::lease_guard(std::shared_ptr<detail::lease_state> s) : state_(std::move(s)) {}
lease_guard::lease_guard(lease_guard&&) noexcept = default;
lease_guard& lease_guard::operator=(lease_guard&& other) noexcept {
  if (this != &other) {
    lease_guard old(std::move(*this));  // releases our current hold, if any
    state_ = std::move(other.state_);
  }
  return *this;
}

lease_guard::~lease_guard() {
  if (!state_) return;
  auto s = std::move(state_);
  try {
    s->release_one();
  } catch (const error& e) {
    std::function<void(const error&)> h = s->on_release_error;
    if (!h) {
      std::lock_guard<std::mutex> lk(detail::handler_mu);
      h = detail::default_handler();
    }
    if (h) {
      try {
        h(e);
      } catch (...) {
      }
    }
  } catch (...) {
  }
}

std::int64_t lease_guard::fence() const noexcept {
  return state_ ? state_->fence : 0;
}
const std::string& lease_guard::owner_token() const noexcept {
  static const std::string empty;
  return state_ ? state_->token : empty;
}
const std::string& lease_guard::name() const noexcept {
  static const std::string empty;
  return state_ ? state_->name : empty;
}
int lease_guard::hold_count() const noexcept {
  return state_ ? state_->holds.load() : 0;
}
bool lease_guard::valid() const noexcept {
  return state_ && state_->valid();
}
milliseconds lease_guard::remaining() const noexcept {
  if (!valid()) return milliseconds(0);
  auto left = state_->deadline_tp() - steady::now();
  return std::max(std::chrono::duration_cast<milliseconds>(left), milliseconds(0));
}

void lease_guard::renew(std::optional<milliseconds> ttl) {
  if (!state_) throw error(errc::not_owner, "renew: the guard holds no lease");
  milliseconds lease = ttl.value_or(state_->ttl);
  if (lease < milliseconds(10) || lease <= state_->margin)
    throw error(errc::invalid_argument, "renew: ttl must be at least 10 ms and above the margin");
  if (state_->lost.load())
    throw error(errc::lease_lost, "renew lease '" + state_->name + "': the lease was lost");
  if (!state_->renew_sql(lease)) {
    error e(errc::lease_lost, "renew lease '" + state_->name +
                                  "': it had expired or been taken over; the successor's row "
                                  "was left untouched");
    state_->mark_lost(e);
    throw e;
  }
}

void lease_guard::release() {
  if (!state_) throw error(errc::not_owner, "release: the guard holds no lease");
  auto s = std::move(state_);
  s->release_one();
}

void lease_guard::fenced(const std::function<void(soci::session&)>& write) {
  if (!state_) throw error(errc::not_owner, "fenced write: the guard holds no lease");
  auto& s = *state_;
  const auto& dbi = s.db;
  const auto& dia = *dbi->dia;
  const std::string what = "fenced write under lease '" + s.name + "'";
  auto conn = dbi->lease(dbi);
  soci::session& sql = conn->sql();
  auto rollback = [&] {
    try {
      sql << "ROLLBACK";
    } catch (...) {
      conn->broken = true;
    }
  };
  try {
    sql << dia.begin_write_sql();
    long long fence = 0;
    soci::indicator ind = soci::i_null;
    sql << "SELECT fence FROM " << dbi->tables.lock
        << " WHERE resource_name = :name AND owner_token = :token AND hold_count > 0"
           " AND expires_at > "
        << dia.now_sql() << dia.for_update_sql(),
        soci::use(s.name, "name"), soci::use(s.token, "token"), soci::into(fence, ind);
    if (!sql.got_data() || ind == soci::i_null || fence != s.fence) {
      rollback();
      error e(errc::lease_lost, what + ": the lease is no longer ours; nothing was written");
      s.mark_lost(e);
      throw e;
    }
  } catch (const error&) {
    throw;
  } catch (...) {
    error e = dbi->failure(what, conn.get());
    rollback();
    throw e;
  }
  try {
    write(sql);
  } catch (const soci::soci_error&) {
    // The caller's own statements: classified like dblock's (unique_violation, deadlock, ...).
    error e = dbi->failure(what, conn.get());
    rollback();
    throw e;
  } catch (...) {
    rollback();
    throw;
  }
  const detail::session_ref sess = detail::session_of(sql);
  try {
    sql << "COMMIT";
  } catch (...) {
    error e = dbi->failure(what + " (COMMIT)", conn.get());
    if (e.code() == errc::connection_lost)
      throw error(errc::in_doubt,
                  what +
                      ": the connection broke during COMMIT; the write may or may not have "
                      "been applied" +
                      detail::in_doubt_finality(dbi, sess),
                  e.backend(), e.sqlstate(), e.native_code());
    rollback();
    throw e;
  }
}

}  // namespace dblock
