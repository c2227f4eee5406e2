// Leader election (see election.hpp): the leadership is a lease on an internal name, kept by its
// watchdog; the winner announces its identity in a fenced transaction; a monitor thread per
// leadership turns a loss or the end of local validity into the lost() cancellation.
#include "dblock/election.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/cancel_access.hpp"
#include "core/identifier.hpp"
#include "core/no_throw.hpp"
#include "kinds/followers.hpp"
#include "lease/fenced.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;

namespace {

// The leadership lease's suffix after the internal separator.
constexpr std::string_view leader_suffix = "L";
constexpr std::size_t max_election_name_bytes =
    detail::max_resource_name_bytes - detail::internal_separator.size() - leader_suffix.size();

void validate_election_name(const std::string& name) {
  detail::validate_resource_name(name);
  if (name.size() > max_election_name_bytes)
    throw error(errc::invalid_argument, "election name '" + detail::printable(name) + "' is " +
                                            std::to_string(name.size()) + " bytes, at most " +
                                            std::to_string(max_election_name_bytes) + " allowed");
}

}  // namespace

std::string election::lease_name(const std::string& name) {
  validate_election_name(name);
  return name + std::string(detail::internal_separator) + std::string(leader_suffix);
}

std::optional<std::string> election::election_of(const std::string& lease_name) {
  const std::string tail = std::string(detail::internal_separator) + std::string(leader_suffix);
  if (lease_name.size() <= tail.size() ||
      lease_name.compare(lease_name.size() - tail.size(), tail.size(), tail) != 0)
    return std::nullopt;
  std::string name = lease_name.substr(0, lease_name.size() - tail.size());
  if (name.find(detail::internal_separator) != std::string::npos) return std::nullopt;
  return name;
}

// ---- leadership --------------------------------------------------------------------------------

struct leadership::impl {
  std::optional<lease_guard> lease;
  std::string name, identity;
  cancellation lost;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread monitor;

  // Wakes at least every 20 ms (a loss the watchdog found) and at the validity deadline; fires
  // `lost` once the lease is lost or its local validity has run out.
  void watch(std::shared_ptr<detail::lease_state> st) {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      if (stop) return;
      const auto now = steady::now();
      if (st->lost.load() || now >= st->deadline_tp()) break;
      cv.wait_until(l, std::min(st->deadline_tp(), now + milliseconds(20)));
    }
    l.unlock();
    st->mark_lost(error(errc::lease_lost,
                        "leadership of election '" + detail::printable(name) +
                            "' ended: the lease was lost or no renewal was confirmed in time"),
                  loss_reason::connection);  // (a loss the watchdog found is reported already)
    ended();
    detail::ring_followers(detail::lease_access::state(*lease)->db, name);
    lost.cancel();
  }

  // listener::leadership(): true once made, false once ended (each once); the followers
  // (await_change(), watch()) hear of both (after the release, for an end).
  std::atomic<bool> leading{false};
  void began() {
    if (!leading.exchange(true))
      detail::lease_access::state(*lease)->db->notify(
          [&](listener& l) { l.leadership(name, true); });
    detail::ring_followers(detail::lease_access::state(*lease)->db, name);
  }
  void ended() {
    if (leading.exchange(false))
      detail::lease_access::state(*lease)->db->notify(
          [&](listener& l) { l.leadership(name, false); });
  }

  void stop_monitor() {
    {
      std::lock_guard<std::mutex> g(mu);
      stop = true;
    }
    cv.notify_all();
    if (monitor.joinable() && monitor.get_id() != std::this_thread::get_id()) monitor.join();
  }
};

leadership::leadership(std::unique_ptr<impl> i) : impl_(std::move(i)) {
  auto st = detail::lease_access::state(*impl_->lease);
  impl_->began();
  impl* self = impl_.get();
  impl_->monitor = std::thread([self, st] { self->watch(st); });
}

leadership::leadership(leadership&&) noexcept = default;

leadership& leadership::operator=(leadership&& other) noexcept {
  if (this != &other) {
    leadership old(std::move(*this));  // resigns the current one, if any
    impl_ = std::move(other.impl_);
  }
  return *this;
}

leadership::~leadership() {
  if (!impl_) return;
  impl_->stop_monitor();
  impl_->ended();
  impl_->lost.cancel();
  auto db = detail::lease_access::state(*impl_->lease)->db;
  impl_->lease.reset();  // releases; failures go to the error handler
  detail::ring_followers(db, impl_->name);
}

std::int64_t leadership::fence() const noexcept {
  return impl_ && impl_->lease ? impl_->lease->fence() : 0;
}
const std::string& leadership::name() const noexcept {
  static const std::string empty;
  return impl_ ? impl_->name : empty;
}
const std::string& leadership::identity() const noexcept {
  static const std::string empty;
  return impl_ ? impl_->identity : empty;
}
bool leadership::valid() const noexcept {
  return impl_ && impl_->lease && !impl_->lost.cancelled() && impl_->lease->valid();
}
milliseconds leadership::remaining() const noexcept {
  return valid() ? impl_->lease->remaining() : milliseconds(0);
}
const cancellation& leadership::lost() const noexcept {
  return impl_ ? impl_->lost : detail::cancel_access::fired();
}
const lease_guard& leadership::lease() const {
  if (!impl_ || !impl_->lease) throw error(errc::not_owner, "lease: not the leader");
  return *impl_->lease;
}

void leadership::resign() {
  if (!impl_ || !impl_->lease) throw error(errc::not_owner, "resign: not the leader");
  auto i = std::move(impl_);
  i->stop_monitor();
  i->ended();
  i->lost.cancel();
  lease_guard g = std::move(*i->lease);
  i->lease.reset();
  struct after_release {  // released or not, followers read again
    std::shared_ptr<detail::database_impl> db;
    const impl& i;
    ~after_release() { detail::ring_followers(db, i.name); }
  } signal{detail::lease_access::state(g)->db, *i};
  g.release();
}

void leadership::fenced(const std::function<void(soci::session&)>& write) {
  if (!impl_ || !impl_->lease) throw error(errc::not_owner, "fenced write: not the leader");
  impl_->lease->fenced(write);
}

// ---- election ----------------------------------------------------------------------------------

struct election::impl {
  database db;
  std::string name, identity;
  lease_lock lock;

  impl(database d, std::string n, std::string id, lease_options o)
      : db(d), name(std::move(n)), identity(std::move(id)), lock(make_lock(d, name, o)) {}

  static lease_lock make_lock(const database& d, const std::string& name, lease_options o) {
    o.watchdog = true;
    return detail::lease_access::internal(d, election::lease_name(name), std::move(o));
  }

  // Announces the identity under the new lease; the leadership, or nothing when the lease was
  // lost before the announcement could commit.
  std::optional<leadership> won(lease_guard g) {
    auto& st = *detail::lease_access::state(g);
    try {
      detail::fenced_write(
          {&st},
          [&](detail::session_scope& s) {
            detail::leader_table::announce(s, name, identity, st.fence);
          },
          "announce the leader of election '" + detail::printable(name) + "'");
    } catch (const error& e) {
      if (e.code() == errc::lease_lost) return std::nullopt;
      throw;  // `g` releases the lease on the way out
    }
    auto i = std::make_unique<leadership::impl>();
    i->lease.emplace(std::move(g));
    i->name = name;
    i->identity = identity;
    return leadership(std::move(i));
  }
};

election::election(database db, std::string name, std::string identity, lease_options options) {
  validate_election_name(name);
  detail::validate_text(identity, "leader identity");
  if (identity.empty() || identity.size() > max_leader_identity_bytes)
    throw error(errc::invalid_argument, "leader identity must be 1.." +
                                            std::to_string(max_leader_identity_bytes) +
                                            " bytes, not " + std::to_string(identity.size()));
  impl_ = std::make_unique<impl>(std::move(db), std::move(name), std::move(identity),
                                 std::move(options));
}

election::~election() = default;
election::election(election&&) noexcept = default;
election& election::operator=(election&&) noexcept = default;

const std::string& election::name() const noexcept {
  return impl_->name;
}
const std::string& election::identity() const noexcept {
  return impl_->identity;
}

std::optional<leadership> election::try_campaign() {
  auto g = impl_->lock.try_acquire();
  if (!g) return std::nullopt;
  return impl_->won(std::move(*g));
}

leadership election::campaign_until(steady_clock::time_point deadline, const cancellation& cancel) {
  const auto start = steady::now();
  for (;;) {
    if (auto l = impl_->won(impl_->lock.acquire_until(deadline, cancel))) return std::move(*l);
    if (steady::now() >= deadline)
      throw error(errc::timeout, "campaign in election '" + detail::printable(impl_->name) +
                                     "': won, but lost again before announcing, within " +
                                     detail::wait_text(start, deadline));
  }
}

std::optional<leadership> election::try_campaign(std::error_code& ec) {
  return detail::no_throw(ec, [&] { return try_campaign(); });
}

std::optional<leader_info> election::observe(const database& db, const std::string& name) {
  const std::string lease = lease_name(name);
  const auto& dbi = detail::access::impl(db);
  return detail::with_read(  // a read: cut at its deadline, errc::timeout
      dbi, "observe election '" + detail::printable(name) + "'",
      [&](detail::session_scope& s) -> std::optional<leader_info> {
        auto row = detail::lock_table::read(s, lease);
        if (!row || row->hold_count <= 0 || row->expires_at_us <= row->now_us) return std::nullopt;
        leader_info info;
        info.fence = row->fence;
        info.since = std::chrono::system_clock::time_point(
            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                std::chrono::microseconds(row->acquired_at_us)));
        info.expires_in = milliseconds((row->expires_at_us - row->now_us) / 1000);
        info.holder_host = row->holder_host;
        info.holder_pid = row->holder_pid;
        auto a = detail::leader_table::read(s, name);
        if (a && a->fence == row->fence) info.identity = a->identity;
        return info;
      });
}

}  // namespace dblock
