// Following an election (see election.hpp, "Following the leadership"): each follower keeps an
// entry in the election's queue of followers (a broadcast queue, dialect/doorbell.hpp) and waits
// on it like a lease waiter; a change of leadership rings every entry (ring_followers()).
#include <unistd.h>

#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/identifier.hpp"
#include "dblock/election.hpp"
#include "kinds/followers.hpp"
#include "lease/lock_impl.hpp"
#include "storage/deadline.hpp"
#include "storage/session.hpp"
#include "storage/wait_queue.hpp"
#include "wake/hub.hpp"
#include "wake/ring.hpp"

namespace dblock {

using detail::steady;
using std::chrono::milliseconds;

namespace {

// The followers (await_change(), watch()) in this process, by election: a candidate of this
// process that wins, resigns or loses a leadership wakes them at once (changed()), whatever
// handle they read through. Followers in other processes are rung through their queue entries
// (ring_followers()). Thread-safe.
class change_board {
 public:
  void join(const std::string& key, detail::hub_entry* w) {
    std::lock_guard<std::mutex> l(mu_);
    waiters_.emplace(key, w);
  }
  void leave(const std::string& key, detail::hub_entry* w) {
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
    for (auto it = from; it != to; ++it)
      it->second->ring();
  }

 private:
  std::mutex mu_;
  std::unordered_multimap<std::string, detail::hub_entry*> waiters_;
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

// The broadcast queue of an election's followers (dialect/doorbell.hpp): each follower keeps an
// entry there, and a change rings every entry.
std::string followers_of(const std::string& election) {
  return election + std::string(detail::broadcast_suffix);
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

// How long a follower's queue entry lives unrefreshed (it is refreshed at a third of that): a
// follower that died is rung no more after that.
constexpr auto follower_ttl = std::chrono::seconds(30);

// One follower of an election: await_change() for one call, watch() for its life. It keeps an
// entry in the election's followers queue, by which a change made in another process rings it
// like a waiter (each backend's doorbell), and is on the change board of this process. While
// rings reach it, it reads only when rung, when the leader's lease would expire (a leader that
// dies rings nobody) and when its entry is refreshed; otherwise it reads every `poll`.
class follower {
 public:
  follower(const database& db, const std::string& election, const cancellation& cancel)
      : db_(db),
        dbi_(detail::access::impl(db)),
        election_(election),
        queue_(followers_of(election)),
        key_(change_key(*dbi_, election)),
        token_(detail::new_owner_token()),
        entry_(*dbi_->hub, queue_, token_, cancel) {
    board().join(key_, &entry_);
  }
  ~follower() {
    board().leave(key_, &entry_);
    if (!ticket_) return;
    try {  // best effort: an entry left behind expires at follower_ttl
      const detail::call_deadline bound(std::chrono::seconds(1), "leave the followers' queue");
      detail::with_session(dbi_, "leave the followers' queue", [&](detail::session_scope& s) {
        return detail::wait_queue::dequeue(s, ticket_, token_);
      });
    } catch (...) {
    }
  }
  follower(const follower&) = delete;
  follower& operator=(const follower&) = delete;

  // The leadership once it differs from `last`; throws timeout at `deadline`, cancelled.
  std::optional<leader_info> next(const std::optional<leader_info>& last,
                                  steady_clock::time_point deadline, const cancellation& cancel,
                                  milliseconds poll) {
    const auto start = steady::now();
    deadline = std::max(deadline, start);
    const std::string what = "wait for a change of election '" + detail::printable(election_) + "'";
    for (;;) {
      if (cancel.cancelled()) throw error(errc::cancelled, what + ": cancelled");
      std::chrono::nanoseconds sleep = poll;
      std::string trouble;
      try {
        // Each round ends by the deadline (a wait that has run out still gets its one read a
        // second), and a wait for ever reads for 30 s at most (a frozen server), then again.
        const auto t = steady::now();
        const detail::call_deadline bound(
            std::min(std::max(deadline, t + std::chrono::seconds(1)), t + std::chrono::seconds(30)),
            what);
        keep_entry();
        const bool live = ticket_ != 0 && entry_.live();  // before the read: a later change rings
        std::optional<leader_info> now = election::observe(db_, election_);
        if (!same_leadership(now, last)) return now;
        if (live) sleep = due_ - steady::now();  // the refresh reads again
        // A leader that dies is replaced only after its lease expires: read again then.
        if (now)
          sleep = std::min<std::chrono::nanoseconds>(sleep, now->expires_in + milliseconds(1));
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
      sleep = std::max(std::chrono::nanoseconds(0),
                       std::min<std::chrono::nanoseconds>(sleep, deadline - now));
      entry_.wait(sleep);  // rung, the time passed, or cancelled (checked above)
    }
  }

 private:
  // Joins the followers' queue, or refreshes the entry, when due. Where no ring from another
  // process can reach this handle (no doorbell: a transaction pooler without listen_url, an
  // in-memory SQLite database) it stays out and reads every poll. A failure leaves it out
  // until the next try, reading every poll meanwhile (a read-only standby refuses the entry).
  void keep_entry() {
    if (!dbi_->hub->rings_across() || steady::now() < due_) return;
    due_ = steady::now() + follower_ttl / 3;
    const auto ttl_us = std::chrono::duration_cast<std::chrono::microseconds>(follower_ttl).count();
    const std::string what = "follow election '" + detail::printable(election_) + "'";
    try {
      if (ticket_ && detail::with_session(dbi_, what, [&](detail::session_scope& s) {
            return detail::wait_queue::refresh(s, ticket_, token_, ttl_us);
          }))
        return;
      ticket_ = 0;
      ticket_ = detail::with_session(dbi_, what, [&](detail::session_scope& s) {
        return detail::wait_queue::enqueue(s, queue_, token_, ttl_us, detail::host_name(),
                                           static_cast<std::int64_t>(::getpid()), entry_.address());
      });
      entry_.set_ticket(ticket_);
      failing_ = false;
    } catch (const std::exception& e) {
      ticket_ = 0;
      if (!failing_)
        dbi_->notify([&](listener& l) {
          l.log(log_level::warning, what + ": cannot join the followers' queue (" + e.what() +
                                        "); reading every poll until it can");
        });
      failing_ = true;
    }
  }

  const database& db_;
  const std::shared_ptr<detail::database_impl>& dbi_;
  const std::string election_, queue_, key_, token_;
  detail::hub_entry entry_;
  std::int64_t ticket_ = 0;
  steady::time_point due_ = steady::time_point::min();  // the next join or refresh
  bool failing_ = false;
};

}  // namespace

void detail::ring_followers(const std::shared_ptr<database_impl>& db,
                            const std::string& election) noexcept {
  try {
    board().changed(change_key(*db, election));
    wait_queue::ring_all(db, followers_of(election), std::chrono::seconds(2));
  } catch (...) {  // (a string's allocation; ring_all() itself never throws)
  }
}

std::optional<leader_info> election::await_change(const database& db, const std::string& name,
                                                  const std::optional<leader_info>& last,
                                                  steady_clock::time_point deadline,
                                                  const cancellation& cancel,
                                                  std::chrono::milliseconds poll) {
  (void)election::lease_name(name);  // validates the name
  check_poll(poll);
  follower f(db, name, cancel);
  return f.next(last, deadline, cancel, poll);
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
  (void)election::lease_name(name);  // validates the name
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
    follower f(db, name, stop);
    while (!stop.cancelled()) {
      try {
        std::optional<leader_info> now =
            last ? f.next(*last, steady::time_point::max(), stop, poll) : first_read(db, name);
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
