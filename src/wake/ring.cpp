#include "wake/ring.hpp"

#include <algorithm>
#include <vector>

#include "core/identifier.hpp"
#include "storage/deadline.hpp"
#include "storage/wait_queue.hpp"
#include "wake/hub.hpp"

namespace dblock::detail::wait_queue {
namespace {

// Where a release rings a sleeping connection (MySQL, statement bell_ring): interrupts the sleep
// of server session `id` (from lock_table::release()). False where the dialect rings otherwise.
bool ring(session_scope& s, std::int64_t id) {
  const auto& st = s.statements();
  if (st.can.ring != release_ring::interrupt || id <= 0) return false;
  s.run(st.bell_ring, {static_cast<long long>(id)});
  return true;
}

}  // namespace

void ring_freed(const std::shared_ptr<database_impl>& db, const std::string& name,
                std::int64_t fence, const std::string& token,
                const lock_table::release_wake& wake) {
  const std::string what = "ring the head waiter of '" + name + "'";
  if (wake.granted > 0) {
    // Handed over: only that waiter may take it, so no other is woken.
    db->hub->handed_to(name, fence + 1, wake.granted, wake.sleeper, wake.granted_bell);
    return;
  }
  std::int64_t sleeper = wake.sleeper;
  queue_head head;
  if (db->hub->wants_head()) {
    try {
      head = with_session(db, what, [&](session_scope& s) { return head_of(s, name, token); });
    } catch (const error&) {
    }
  }
  db->hub->released(name, fence, head.token, head.bell);
  // PostgreSQL: a head on this host that the release left to this process (`sleeper` is its
  // handle) is rung through the relay's directory, or else notified through the database after
  // all; so is the head after a release whose reply was lost (-1 with the releaser's token; a
  // forced release, without one, notified in its own statement).
  if (db->statements.can.ring == release_ring::notify) {
    if (sleeper == 0 || (sleeper < 0 && token.empty())) return;
    if (sleeper > 0 &&
        (db->hub->is_own_bell(sleeper) || db->hub->ring_handle(name, fence, sleeper, 0)))
      return;
    try {
      with_session(db, what, [&](session_scope& s) {
        s.run(s.statements().head_notify, {name, token, static_cast<long long>(fence)});
      });
    } catch (const error&) {
    }
    return;
  }
  if (sleeper == 0 || db->statements.can.ring != release_ring::interrupt) return;
  try {
    with_session(db, what, [&](session_scope& s) {
      if (sleeper < 0) {
        const sql_result r = s.run(s.statements().head_sleeper, {name, token});
        sleeper = r.empty() || r.is_null(0, 0) ? 0 : r.integer(0, 0);
      }
      if (sleeper > 0 && !db->hub->is_own_bell(sleeper)) ring(s, sleeper);  // own: woken above
    });
  } catch (const error&) {
  }
}

void ring_all(const std::shared_ptr<database_impl>& db, const std::string& name,
              std::chrono::milliseconds bound) noexcept {
  const std::string what = "ring the followers of '" + printable(name) + "'";
  try {
    const call_deadline limit(bound, what);
    with_session(db, what, [&](session_scope& s) {
      const sql_result r = s.run(s.statements().queue_ring_all, {name});
      std::vector<std::int64_t> sleepers;
      for (std::size_t i = 0; i < r.rows.size(); ++i) {
        // This handle's entry is woken here; another's through the doorbell (SQLite; a no-op
        // where the query rang it, PostgreSQL, or where its sleeper is interrupted, MySQL).
        db->hub->released(name, 0, r.text(i, 0), r.is_null(i, 1) ? std::string() : r.text(i, 1));
        const std::int64_t id = r.is_null(i, 2) ? 0 : r.integer(i, 2);
        if (id > 0 && !db->hub->is_own_bell(id) &&
            std::find(sleepers.begin(), sleepers.end(), id) == sleepers.end())
          sleepers.push_back(id);
      }
      for (std::int64_t id : sleepers)
        ring(s, id);
    });
  } catch (const std::exception& e) {
    db->notify([&](listener& l) {
      l.log(log_level::warning,
            what + ": " + e.what() + "; they read again at their next safety-net read");
    });
  } catch (...) {
  }
}

}  // namespace dblock::detail::wait_queue
