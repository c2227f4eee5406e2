// Leader election (see election.hpp): the leadership is a lease on an internal name, kept by its
// watchdog; the winner announces its identity in a fenced transaction; a monitor thread per
// leadership turns a loss or the end of local validity into the lost() cancellation.
#include "dblock/election.hpp"

#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "identifier.hpp"
#include "lease/lock_impl.hpp"
#include "lease/state.hpp"
#include "no_throw.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"
#include "wake/cancel_access.hpp"

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

// ---- changes of leadership within this process (await_change()) ------------------------------

// One await_change() call: woken when a candidate of this process changes the leadership.
struct change_waiter {
  std::atomic<bool> flag{false};
  detail::wake_slot slot;
};

// The waits of await_change() in this process, by election: a candidate of this process that
// wins, resigns or loses a leadership wakes them (changed()). Thread-safe.
class change_board {
 public:
  void join(const std::string& key, change_waiter* w) {
    std::lock_guard<std::mutex> l(mu_);
    waiters_.emplace(key, w);
  }
  void leave(const std::string& key, change_waiter* w) {
    std::lock_guard<std::mutex> l(mu_);
    auto [from, to] = waiters_.equal_range(key);
    for (auto it = from; it != to; ++it)
      if (it->second == w) {
        waiters_.erase(it);
        return;
      }
  }
  void changed(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    auto [from, to] = waiters_.equal_range(key);
    for (auto it = from; it != to; ++it) {
      it->second->flag.store(true);
      detail::cancel_access::poke(it->second->slot);
    }
  }

 private:
  std::mutex mu_;
  std::unordered_multimap<std::string, change_waiter*> waiters_;
};

// Never destroyed: a leadership may end while statics are destroyed.
change_board& board() {
  static auto* b = new change_board;
  return *b;
}

// Elections are told apart by URL, lock table and name: two handles of one database meet.
std::string change_key(const detail::database_impl& d, const std::string& election) {
  return d.redacted_url + '\n' + d.tables.lock + '\n' + election;
}

bool same_leadership(const std::optional<leader_info>& a, const std::optional<leader_info>& b) {
  if (!a || !b) return !a && !b;
  return a->fence == b->fence && a->identity == b->identity;
}

void check_poll(std::chrono::milliseconds poll) {
  if (poll < milliseconds(10) || poll > std::chrono::hours(1))
    throw error(errc::invalid_argument, "election watch: poll must be 10 ms .. 1 h, not " +
                                            std::to_string(poll.count()) + " ms");
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
    board().changed(key);
    lost.cancel();
  }

  // listener::leadership(): true once made, false once ended (each once); the waits of
  // await_change() in this process hear of both (after the release, for an end).
  std::atomic<bool> leading{false};
  std::string key;  // change_key()
  void began() {
    key = change_key(*lease->state_->db, name);
    if (!leading.exchange(true))
      lease->state_->db->notify([&](listener& l) { l.leadership(name, true); });
    board().changed(key);
  }
  void ended() {
    if (leading.exchange(false))
      lease->state_->db->notify([&](listener& l) { l.leadership(name, false); });
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
  auto st = impl_->lease->state_;
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
  impl_->lease.reset();  // releases; failures go to the error handler
  board().changed(impl_->key);
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
  static const cancellation fired = [] {
    cancellation c;
    c.cancel();
    return c;
  }();
  return impl_ ? impl_->lost : fired;
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
  struct after_release {  // released or not, watchers read again
    const std::string& key;
    ~after_release() { board().changed(key); }
  } signal{i->key};
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
    return lease_lock(d, election::lease_name(name), std::move(o), detail::internal_name_t{});
  }

  // Announces the identity under the new lease; the leadership, or nothing when the lease was
  // lost before the announcement could commit.
  std::optional<leadership> won(lease_guard g) {
    auto& st = *g.state_;
    try {
      detail::write_transaction(
          st.db, "announce the leader of election '" + detail::printable(name) + "'", std::nullopt,
          [&](detail::session_scope& s) {
            auto fence = detail::lock_table::fenced_check(s, st.name, st.token);
            if (!fence || *fence != st.fence)
              throw error(errc::lease_lost, "the leadership was lost before it was announced");
            detail::leader_table::announce(s, name, identity, st.fence);
          });
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
  return detail::with_session(
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

std::optional<leader_info> election::await_change(const database& db, const std::string& name,
                                                  const std::optional<leader_info>& last,
                                                  steady_clock::time_point deadline,
                                                  const cancellation& cancel,
                                                  std::chrono::milliseconds poll) {
  validate_election_name(name);
  check_poll(poll);
  const auto start = steady::now();
  deadline = std::max(deadline, start);
  const std::string what = "wait for a change of election '" + detail::printable(name) + "'";
  const std::string key = change_key(*detail::access::impl(db), name);
  change_waiter w;
  board().join(key, &w);
  struct leaver {
    const std::string& key;
    change_waiter* w;
    ~leaver() { board().leave(key, w); }
  } leave{key, &w};
  for (;;) {
    if (cancel.cancelled()) throw error(errc::cancelled, what + ": cancelled");
    w.flag.store(false);  // a change from here on ends the sleep below at once
    std::chrono::nanoseconds sleep = poll;
    std::string trouble;
    try {
      // Each read ends by the deadline (a wait that has run out still gets its one read a
      // second), and a wait for ever reads for 30 s at most (a frozen server), then again.
      const auto t = steady::now();
      const detail::call_deadline bound(
          std::min(std::max(deadline, t + std::chrono::seconds(1)), t + std::chrono::seconds(30)),
          what);
      std::optional<leader_info> now = observe(db, name);
      if (!same_leadership(now, last)) return now;
      // A leader that dies is replaced only after its lease expires: read again then.
      if (now) sleep = std::min<std::chrono::nanoseconds>(sleep, now->expires_in + milliseconds(1));
    } catch (const error& e) {
      // Rides out a failover or a frozen server, as waits do: read again until the deadline.
      if (e.code() != errc::connection_failed && e.code() != errc::connection_lost &&
          e.code() != errc::timeout)
        throw;
      trouble = std::string(" (") + e.what() + ")";
    }
    const auto now = steady::now();
    if (now >= deadline)
      throw error(errc::timeout,
                  what + ": none within " + detail::wait_text(start, deadline) + trouble);
    sleep = std::min<std::chrono::nanoseconds>(sleep, deadline - now);
    detail::cancel_access::wait(cancel, sleep, w.flag, w.slot);
  }
}

// ---- leader_watch ------------------------------------------------------------------------------

namespace {
// A watch's first read, bounded as await_change()'s reads are (a frozen server keeps stop()
// waiting 30 s at most).
std::optional<leader_info> first_read(const database& db, const std::string& name) {
  const detail::call_deadline bound(
      std::chrono::seconds(30),
      "the first read of a watch of election '" + detail::printable(name) + "'");
  return election::observe(db, name);
}
}  // namespace

struct leader_watch::impl {
  cancellation stop;
  std::thread thread;
};

leader_watch::leader_watch(std::unique_ptr<impl> i) : impl_(std::move(i)) {}
leader_watch::leader_watch(leader_watch&&) noexcept = default;
leader_watch& leader_watch::operator=(leader_watch&& other) noexcept {
  if (this != &other) {
    stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
leader_watch::~leader_watch() {
  stop();
}

void leader_watch::stop() noexcept {
  if (!impl_) return;
  impl_->stop.cancel();
  if (impl_->thread.joinable() && impl_->thread.get_id() != std::this_thread::get_id())
    impl_->thread.join();
}

leader_watch election::watch(const database& db, const std::string& name,
                             std::function<void(const std::optional<leader_info>&)> on_change,
                             std::chrono::milliseconds poll) {
  validate_election_name(name);
  check_poll(poll);
  if (!on_change) throw error(errc::invalid_argument, "election watch: the callback is empty");
  auto i = std::make_unique<leader_watch::impl>();
  const cancellation stop = i->stop;
  i->thread = std::thread([db, name, on_change = std::move(on_change), poll, stop] {
    const auto& dbi = detail::access::impl(db);
    auto report = [&](const std::string& m) {
      dbi->notify([&](listener& l) {
        l.log(log_level::warning, "watch of election '" + detail::printable(name) + "': " + m);
      });
    };
    std::optional<std::optional<leader_info>> last;  // nothing: not read yet
    while (!stop.cancelled()) {
      try {
        std::optional<leader_info> now =
            last ? await_change(db, name, *last, steady::time_point::max(), stop, poll)
                 : first_read(db, name);
        last = now;
        try {
          on_change(now);
        } catch (const std::exception& e) {
          report(std::string("the callback threw: ") + e.what());
        } catch (...) {
          report("the callback threw");
        }
      } catch (const error& e) {
        if (e.code() == errc::cancelled || stop.cancelled()) return;
        report(std::string(e.what()) + "; reading again in " + std::to_string(poll.count()) +
               " ms");
        stop.sleep_for(poll);
      } catch (const std::exception& e) {
        report(e.what());
        stop.sleep_for(poll);
      }
    }
  });
  return leader_watch(std::move(i));
}

}  // namespace dblock
