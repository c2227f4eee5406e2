#include "lease/renewer.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <iterator>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "lease/state.hpp"
#include "storage/lock_table.hpp"
#include "storage/wait_queue.hpp"

namespace dblock::detail {

using std::chrono::milliseconds;
using state_ptr = std::shared_ptr<lease_state>;

namespace {

milliseconds interval_of(const lease_state& s) {
  return std::max(s.ttl / 3, milliseconds(1));
}

// After a failed or busy renewal: try again soon (the watcher reports the loss if the validity
// runs out first).
milliseconds retry_of(const lease_state& s) {
  return std::max(std::min(interval_of(s) / 4, milliseconds(250)), milliseconds(1));
}

}  // namespace

struct lease_renewer::core {
  struct entry {
    state_ptr state;  // strong: dropped by unwatch() or by the loss report
    steady::time_point due;
    bool in_flight = false;
    /// watch_validity(): never renewed (due stays max); the watcher fires the state's `ended`
    /// signal when its local validity runs out, and drops it.
    bool validity_only = false;
  };

  std::weak_ptr<database_impl> db;
  std::mutex mu;
  std::condition_variable runner_cv, watcher_cv;
  std::unordered_map<const lease_state*, entry> entries;
  std::deque<std::shared_ptr<wait_queue::deferred_exit>> exits;  // queue entries to delete
  // When each thread sleeps until (min: awake, it looks again before sleeping).
  steady::time_point runner_wake = steady::time_point::min();
  steady::time_point watcher_wake = steady::time_point::min();
  bool stop = false;
  // Leases whose loss is being reported, and the reporting thread: unwatch() of one of them
  // waits for its report (unless called from inside it).
  std::unordered_map<const lease_state*, std::thread::id> reporting;
  std::condition_variable reported_cv;
  // True while the runner renews a round of batches (it then holds their leases and the
  // database); idle_cv is notified when the round is over.
  bool round_running = false;
  std::thread::id runner_id;
  std::condition_variable idle_cv;
  std::thread runner, watcher;

  void run();
  void watch_deadlines();
  void renew(std::vector<state_ptr>& batch);
  void renew_sessions(std::vector<state_ptr>& batch);
  void renew_session(const state_ptr& s);
  /// A lease found lost, why, and (unknown: read the row to tell) the reason.
  struct loss {
    state_ptr state;
    error why;
    std::optional<loss_reason> reason;
  };
  void report(std::vector<loss>& lost);
  // Sleeps until `until` (max: until notified); `wake` records it for watch().
  void sleep(std::unique_lock<std::mutex>& lk, std::condition_variable& cv,
             steady::time_point& wake, steady::time_point until) {
    wake = until;
    if (until == steady::time_point::max())
      cv.wait(lk);
    else
      cv.wait_until(lk, until);
    wake = steady::time_point::min();
  }
};

// Reports each loss once, for leases still watched (dropping them first).
void lease_renewer::core::report(std::vector<loss>& lost) {
  for (auto& [s, why, reason] : lost) {
    {
      std::lock_guard<std::mutex> lk(mu);
      auto it = entries.find(s.get());
      if (it == entries.end() || it->second.state != s) continue;  // unwatched meanwhile
      entries.erase(it);
      reporting[s.get()] = std::this_thread::get_id();
    }
    s->mark_lost(why, reason ? *reason : s->read_loss());
    {
      std::lock_guard<std::mutex> lk(mu);
      reporting.erase(s.get());
    }
    reported_cv.notify_all();
  }
  lost.clear();  // the last references may go here, outside the lock
}

// A batch's round trip (failed ones included) and, when it failed, each lease's failure.
static void report_round(database_impl& dbi, steady::time_point sent,
                         const std::optional<error>& failure, const std::vector<state_ptr>& batch) {
  dbi.notify([&](listener& l) {
    l.renew_latency(std::chrono::duration_cast<std::chrono::microseconds>(steady::now() - sent));
  });
  if (failure)
    for (const auto& s : batch)
      dbi.notify([&](listener& l) { l.renew_failed(s->name, *failure); });
}

// One batch of leases with the same TTL.
// Session leases (lease_mode::session) are renewed one by one, by a statement on the server
// session that holds each: renewed here and taken out of the batch.
void lease_renewer::core::renew_sessions(std::vector<state_ptr>& batch) {
  const auto rows = std::stable_partition(batch.begin(), batch.end(),
                                          [](const state_ptr& s) { return !s->session_mode; });
  std::vector<state_ptr> sessions(std::make_move_iterator(rows),
                                  std::make_move_iterator(batch.end()));
  batch.erase(rows, batch.end());
  for (auto& s : sessions)
    renew_session(s);
}

void lease_renewer::core::renew(std::vector<state_ptr>& batch) {
  renew_sessions(batch);
  if (batch.empty()) return;
  std::vector<lock_table::renewal> rs;
  for (const auto& s : batch)
    rs.push_back({s->name, s->token, s->fence});
  const milliseconds ttl = batch.front()->ttl;
  std::vector<lock_table::renewal_outcome> out;
  std::optional<error> failure;
  int round_trips = 0;
  const auto sent = steady::now();
  if (auto dbi = db.lock()) {
    const call_deadline bound(batch.front()->call_bound(), batch.front()->call_bound_what());
    try {
      out = with_session(dbi, "renew leases", [&](session_scope& s) {
        return lock_table::renew_batch(
            s, rs, std::chrono::duration_cast<std::chrono::microseconds>(ttl).count(), round_trips);
      });
      const auto renewed = static_cast<std::size_t>(
          std::count(out.begin(), out.end(), lock_table::renewal_outcome::renewed));
      dbi->notify([&](listener& l) { l.renewed(renewed, round_trips); });
    } catch (const error& e) {
      failure = e;
    } catch (const std::exception& e) {
      failure = error(errc::backend_error, std::string("renew leases: ") + e.what());
    }
    report_round(*dbi, sent, failure, batch);
  } else {
    failure = error(errc::backend_error, "renew leases: the database handle is gone");
  }
  std::vector<loss> lost;
  {
    std::lock_guard<std::mutex> lk(mu);
    const auto now = steady::now();
    for (std::size_t k = 0; k < batch.size(); ++k) {
      auto it = entries.find(batch[k].get());
      if (it == entries.end() || it->second.state != batch[k]) continue;  // unwatched meanwhile
      entry& e = it->second;
      e.in_flight = false;
      const lease_state& s = *batch[k];
      if (failure || out[k] == lock_table::renewal_outcome::busy) {
        e.due = now + retry_of(s);
      } else if (out[k] == lock_table::renewal_outcome::renewed) {
        batch[k]->set_deadline(sent, ttl);
        e.due = sent + interval_of(s);
      } else {
        lost.push_back({batch[k],
                        error(errc::lease_lost,
                              "lease '" + s.name + "' expired or was taken over; watchdog stopped"),
                        std::nullopt});
      }
    }
  }
  if (!lost.empty()) {
    watcher_cv.notify_one();
    report(lost);
  }
  batch.clear();
}

// A session lease: one statement on its holding session restarts the server's idle timer (its
// TTL). A failure means the session is gone or unusable, and the lock with it.
void lease_renewer::core::renew_session(const state_ptr& s) {
  const auto sent = steady::now();
  const bool alive = s->pinned_alive();
  std::vector<loss> lost;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = entries.find(s.get());
    if (it == entries.end() || it->second.state != s) return;  // unwatched meanwhile
    entry& e = it->second;
    e.in_flight = false;
    if (alive) {
      s->set_deadline(sent, s->ttl);
      e.due = sent + interval_of(*s);
    } else {
      lost.push_back({s,
                      error(errc::lease_lost, "lease '" + s->name +
                                                  "': its server session ended (session mode); "
                                                  "watchdog stopped"),
                      loss_reason::connection});
    }
  }
  if (!lost.empty()) {
    watcher_cv.notify_one();
    report(lost);
  }
}

// The runner: sleeps until the first lease is due, then renews every lease within half an
// interval of being due, grouped by TTL, in batches of at most renew_batch_max.
void lease_renewer::core::run() {
  std::unique_lock<std::mutex> lk(mu);
  while (!stop) {
    if (!exits.empty()) {
      // The queue entries waiting now first (each is on the way of a release), then whatever
      // renewals are due: a steady stream of entries never holds renewals off.
      std::deque<std::shared_ptr<wait_queue::deferred_exit>> todo;
      todo.swap(exits);
      lk.unlock();
      if (auto dbi = db.lock())
        for (const auto& x : todo)
          x->finish(dbi, milliseconds(0), false);
      todo.clear();
      lk.lock();
      if (stop) break;
    }
    const auto now = steady::now();
    auto next = steady::time_point::max();
    for (const auto& [k, e] : entries)
      if (!e.in_flight) next = std::min(next, e.due);
    if (next > now) {
      if (exits.empty()) sleep(lk, runner_cv, runner_wake, next);
      continue;
    }
    std::map<milliseconds::rep, std::vector<state_ptr>> due;
    for (auto& [k, e] : entries)
      if (!e.in_flight && e.due - interval_of(*e.state) / 2 <= now) {
        e.in_flight = true;
        due[e.state->ttl.count()].push_back(e.state);
      }
    round_running = true;
    lk.unlock();
    for (auto& [ttl, group] : due)
      for (std::size_t from = 0; from < group.size(); from += lock_table::renew_batch_max) {
        const std::size_t to = std::min(group.size(), from + lock_table::renew_batch_max);
        std::vector<state_ptr> batch(group.begin() + static_cast<std::ptrdiff_t>(from),
                                     group.begin() + static_cast<std::ptrdiff_t>(to));
        renew(batch);
      }
    due.clear();
    lk.lock();
    round_running = false;
    idle_cv.notify_all();
  }
}

// The watcher: reports every watched lease whose local validity ran out before its renewal
// completed (or that is known lost).
void lease_renewer::core::watch_deadlines() {
  std::unique_lock<std::mutex> lk(mu);
  while (!stop) {
    const auto now = steady::now();
    auto next = steady::time_point::max();
    std::vector<loss> lost;
    std::vector<state_ptr> ended;  // validity_only entries whose validity ran out
    for (auto it = entries.begin(); it != entries.end();) {
      const entry& e = it->second;
      if (!e.validity_only) {
        ++it;
        continue;
      }
      const auto deadline = e.state->deadline_tp();
      if (deadline <= now || e.state->lost.load()) {
        ended.push_back(e.state);
        it = entries.erase(it);
      } else {
        next = std::min(next, deadline);
        ++it;
      }
    }
    if (!ended.empty()) {
      lk.unlock();
      for (const auto& s : ended)
        s->fire_ended();
      ended.clear();  // the last references may go here, outside the lock
      lk.lock();
      continue;
    }
    for (const auto& [k, e] : entries) {
      if (e.validity_only) continue;
      const auto deadline = e.state->deadline_tp();
      if (deadline <= now || e.state->lost.load())
        lost.push_back({e.state,
                        error(errc::lease_lost, "lease '" + e.state->name +
                                                    "': a renewal did not complete before the "
                                                    "local validity ran out; watchdog stopped"),
                        loss_reason::connection});
      else
        next = std::min(next, deadline);
    }
    if (!lost.empty()) {
      lk.unlock();
      report(lost);
      lk.lock();
      continue;
    }
    sleep(lk, watcher_cv, watcher_wake, next);
  }
}

lease_renewer::lease_renewer(std::weak_ptr<database_impl> db) : core_(std::make_shared<core>()) {
  core_->db = std::move(db);
  core_->runner = std::thread([c = core_] { c->run(); });
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    core_->runner_id = core_->runner.get_id();
  }
  core_->watcher = std::thread([c = core_] { c->watch_deadlines(); });
}

lease_renewer::~lease_renewer() {
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    core_->stop = true;
  }
  core_->runner_cv.notify_all();
  core_->watcher_cv.notify_all();
  for (std::thread* t : {&core_->runner, &core_->watcher}) {
    if (!t->joinable()) continue;
    if (t->get_id() == std::this_thread::get_id())
      t->detach();  // the handle's last reference went on this thread
    else
      t->join();
  }
}

void lease_renewer::watch(const std::shared_ptr<lease_state>& s) {
  const auto due = steady::now() + interval_of(*s);
  bool wake_runner = false, wake_watcher = false;
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    core_->entries[s.get()] = core::entry{s, due, false};
    wake_runner = due < core_->runner_wake;
    wake_watcher = s->deadline_tp() < core_->watcher_wake;
  }
  if (wake_runner) core_->runner_cv.notify_one();
  if (wake_watcher) core_->watcher_cv.notify_one();
}

void lease_renewer::watch_validity(const std::shared_ptr<lease_state>& s) {
  bool wake_watcher = false;
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    auto [it, added] =
        core_->entries.try_emplace(s.get(), core::entry{s, steady::time_point::max(), false, true});
    (void)it;
    wake_watcher = added && s->deadline_tp() < core_->watcher_wake;
  }
  if (wake_watcher) core_->watcher_cv.notify_one();
}

void lease_renewer::unwatch(const lease_state* s) {
  state_ptr keep;  // dropped outside the lock
  std::unique_lock<std::mutex> lk(core_->mu);
  auto it = core_->entries.find(s);
  if (it != core_->entries.end()) {
    const bool in_flight = it->second.in_flight;
    keep = std::move(it->second.state);
    core_->entries.erase(it);
    // A renewal of it is in flight: wait (briefly, and never on the runner itself) until the
    // round is over, so that once the last watched lease is released no renewal still runs on
    // the handle's connections (a process may exit right after).
    if (in_flight && std::this_thread::get_id() != core_->runner_id) {
      const auto until = std::min(keep->deadline_tp(), steady::now() + std::chrono::seconds(2));
      core_->idle_cv.wait_until(lk, until, [&] { return !core_->round_running; });
    }
    lk.unlock();
    return;
  }
  // Its loss is being reported: wait for the report, unless this is the reporting thread.
  core_->reported_cv.wait(lk, [&] {
    auto r = core_->reporting.find(s);
    return r == core_->reporting.end() || r->second == std::this_thread::get_id();
  });
}

void lease_renewer::leave_queue_later(std::shared_ptr<wait_queue::deferred_exit> x) {
  {
    std::lock_guard<std::mutex> lk(core_->mu);
    core_->exits.push_back(std::move(x));
  }
  core_->runner_cv.notify_one();
}

lease_renewer& renewer_of(const std::shared_ptr<database_impl>& db) {
  std::lock_guard<std::mutex> lk(db->renewer_mu);
  if (!db->renewer) db->renewer = std::make_shared<lease_renewer>(db);
  return *db->renewer;
}

}  // namespace dblock::detail
