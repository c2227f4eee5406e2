// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/lease_lock.hpp"

namespace soci {
class session;
}

/// @file
/// @brief Leader election (dblock::election): one leader among many candidates, observable by
///        anyone, whose loss is a first-class signal.

namespace dblock {

/// The longest identity a candidate may announce, in bytes.
inline constexpr std::size_t max_leader_identity_bytes = 1024;

/// The current leader of an election, as election::observe() reads it.
struct leader_info {
  /// What the leader announced when it won (for example "replica-3 http://10.0.0.3:8080");
  /// empty in the short moment between its win and its announcement.
  std::string identity;
  /// The leadership's fencing token: strictly greater than every earlier leader's.
  std::int64_t fence = 0;
  /// When it won, on the database clock.
  std::chrono::system_clock::time_point since;
  /// Until its lease expires unless renewed, on the database clock.
  std::chrono::milliseconds expires_in{0};
  /// The leader process's host name and process id.
  std::string holder_host;
  /// The leader process's id on holder_host.
  std::int64_t holder_pid = 0;
};

/**
 * @brief Being the leader: one lease, renewed by its watchdog, and the signal that it ended.
 *
 * Move-only; a moved-from leadership is disarmed. The destructor resigns (failures go to the
 * error handler, never thrown).
 *
 * lost() is a cancellation that fires when the leadership ends for any reason: the watchdog
 * found the lease lost (expired, taken over, force-released), the local validity ran out because
 * no renewal was confirmed in time (counted from when the acquire or last successful renew
 * request was sent, minus the safety margin: the moment another candidate may win), or
 * resign(). Pass it to the leader's work (waits, loops) so the work stops as soon as it must.
 * lease_options::on_lost is called once as well, for a loss (not for resign()).
 */
class leadership {
 public:
  /// Takes over `other`'s leadership; `other` is disarmed.
  leadership(leadership&&) noexcept;
  /// Resigns this leadership, if any (as the destructor), then takes over `other`'s.
  leadership& operator=(leadership&&) noexcept;
  leadership(const leadership&) = delete;
  leadership& operator=(const leadership&) = delete;
  /// Resigns as resign() does; failures go to the error handler. Never throws.
  ~leadership();

  /// The leadership's fencing token (0 when disarmed).
  std::int64_t fence() const noexcept;
  /// The election's name (empty when disarmed).
  const std::string& name() const noexcept;
  /// The identity this leader announced (empty when disarmed).
  const std::string& identity() const noexcept;
  /// False once the leadership ended (lost(), resign()) or was disarmed.
  bool valid() const noexcept;
  /// Conservative time left before the leadership must be treated as lost (lease_guard).
  std::chrono::milliseconds remaining() const noexcept;
  /// Fires when the leadership ends (see the class comment). Valid while this object lives.
  const cancellation& lost() const noexcept;
  /**
   * @brief The leadership's lease (its owner token, fence, name).
   * @throws dblock::error errc::not_owner when disarmed.
   */
  const lease_guard& lease() const;

  /**
   * @brief Steps down: releases the lease, so another candidate can win at once; lost() fires.
   *        The leadership is disarmed afterwards.
   * @throws dblock::error as lease_guard::release() (errc::lease_lost when it had already been
   *         lost); errc::not_owner when disarmed.
   */
  void resign();

  /**
   * @brief Runs `write` in one transaction that commits only while this is still the leader
   *        (lease_guard::fenced()).
   * @param write the caller's statements, run on the transaction's session.
   * @throws dblock::error as lease_guard::fenced(); errc::not_owner when disarmed.
   */
  void fenced(const std::function<void(soci::session&)>& write);

 private:
  friend class election;
  struct impl;
  explicit leadership(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

/**
 * @brief Follows the leadership of one election (election::watch()): its callback runs on a
 *        thread of its own until the watch is stopped or destroyed.
 *
 * Move-only; a moved-from watch is inert. Thread-safety: stop() may be called from any thread
 * but the callback's own.
 */
class leader_watch {
 public:
  /// Takes over `other`'s watch; `other` is inert afterwards.
  leader_watch(leader_watch&&) noexcept;
  /// Stops this watch (as stop()), then takes over `other`'s.
  leader_watch& operator=(leader_watch&&) noexcept;
  leader_watch(const leader_watch&) = delete;
  leader_watch& operator=(const leader_watch&) = delete;
  /// Stops the watch as stop() does. Never throws.
  ~leader_watch();
  /// Stops the thread: a callback in progress finishes first, none follows; a read in progress
  /// too (30 s at most, against a frozen server). Idempotent. Must not
  /// be called from the callback itself (it returns at once there, and the thread ends after
  /// the callback). Never throws.
  void stop() noexcept;

 private:
  friend class election;
  struct impl;
  explicit leader_watch(std::unique_ptr<impl> i);
  std::unique_ptr<impl> impl_;
};

/**
 * @brief One candidate in the leader election `name`.
 *
 * The leadership is a lease on an internal name of the lock table ("name" U+FFFF "L", shown by
 * `dblock status` as `NAME [leader]`), so a lock named like the election is a different row. A
 * candidate that wins announces its identity in a fenced transaction (table `leader`, migration
 * 0007); observe() reads the lease and the announcement together and shows an identity only when
 * it was written under the current leader's fence. The watchdog is always on (the leader keeps
 * its lease until it resigns or dies); a leader that dies is replaced when its lease expires
 * (lease_options::ttl).
 *
 * Names are 1..251 bytes of valid UTF-8 without NUL or U+FFFF. Thread-safety: like lease_lock,
 * one election object is for one thread at a time; observe() may be called from anywhere.
 */
class election {
 public:
  /**
   * @brief Candidate `identity` in election `name` of `db`; opens no connection.
   * @param db the database holding the lock table and the `leader` table.
   * @param name the election, shared by every candidate.
   * @param identity what this candidate announces when it wins (1..1024 bytes of UTF-8 without
   *        NUL).
   * @param options the leadership lease (ttl, safety_margin, on_lost, polling, fair);
   *        `watchdog` is always on.
   * @throws dblock::error errc::invalid_argument for a bad name or identity, or options
   *         lease_lock refuses.
   */
  election(database db, std::string name, std::string identity, lease_options options = {});
  /// Destroys the handle only: a leadership it returned stays in force.
  ~election();
  /// Takes over `other`; `other` must not be used afterwards except to be assigned or destroyed.
  election(election&&) noexcept;
  /// Takes over `other` as the move constructor does.
  election& operator=(election&&) noexcept;

  /**
   * @brief One attempt to become the leader; nothing when another candidate leads.
   * @throws dblock::error lease_lock::try_acquire()'s errors and those of the announcement's
   *         fenced write (the lease is released first).
   */
  [[nodiscard]] std::optional<leadership> try_campaign();
  /// try_campaign() without exceptions: on a failure it returns nothing and sets `ec` to the
  /// error's code (docs/errors.md); otherwise it clears `ec`. Only std::bad_alloc escapes.
  [[nodiscard]] std::optional<leadership> try_campaign(std::error_code& ec);

  /**
   * @brief Waits up to `wait` (any std::chrono duration; `max()` for ever, zero or negative:
   *        one try) to become the leader: campaign_until(deadline_after(wait), cancel).
   * @throws dblock::error as campaign_until().
   */
  template <class Rep, class Period>
  [[nodiscard]] leadership campaign(const std::chrono::duration<Rep, Period>& wait,
                                    const cancellation& cancel = cancellation()) {
    return campaign_until(deadline_after(wait), cancel);
  }

  /**
   * @brief Waits until `deadline` to become the leader (woken when the leader resigns,
   *        otherwise when its lease expires).
   * @param deadline when to give up (in the past: one try; `time_point::max()`: never).
   * @param cancel stops the campaign (errc::cancelled).
   * @throws dblock::error errc::timeout, errc::cancelled, and the errors of try_campaign().
   */
  [[nodiscard]] leadership campaign_until(steady_clock::time_point deadline,
                                          const cancellation& cancel = cancellation());

  /**
   * @brief The current leader of election `name`, or nothing when there is none (no lease, or
   *        an expired or released one). Two reads, no write.
   * @throws dblock::error errc::invalid_argument for a bad name; the @ref database_errors
   *         "database errors".
   */
  static std::optional<leader_info> observe(const database& db, const std::string& name);

  /**
   * @brief Waits until the leadership of election `name` differs from `last` (another fence, a
   *        leader where `last` had none or none where it had one, or the identity announced
   *        since) and returns it: the new leader, or nothing when there is none.
   *
   * The wait is woken like a lease waiter, not by polling: it keeps an entry in the election's
   * queue of followers, and a candidate that wins, resigns or loses the leadership rings every
   * entry (in this process at once, through any database handle with the same URL and table
   * prefix; in other processes through the backend's wake-ups, as a release rings a waiter).
   * A leader that dies rings nobody: the wait reads again at its lease's expiry, which is when
   * another candidate can win. While rings reach it, the wait also reads when its queue entry is
   * refreshed (every 10 s); where they cannot (behind a transaction pooler without
   * database_options::listen_url, on Galera, an in-memory SQLite database) it reads every
   * `poll`. A connection that fails is tried again until the deadline (failovers are ridden
   * out).
   * @param db the database of the election.
   * @param name the election.
   * @param last what the caller knows (observe()'s value, or the last change returned).
   * @param deadline when to give up (in the past: one read; `time_point::max()`: never).
   * @param cancel stops the wait (errc::cancelled).
   * @param poll how often the leadership is read where rings cannot reach the wait
   *        (10 ms..1 h).
   * @throws dblock::error errc::timeout when nothing changed by the deadline,
   *         errc::cancelled, errc::invalid_argument for a bad name or poll, and the
   *         @ref database_errors "database errors" other than lost connections.
   */
  static std::optional<leader_info> await_change(
      const database& db, const std::string& name, const std::optional<leader_info>& last,
      steady_clock::time_point deadline, const cancellation& cancel = cancellation(),
      std::chrono::milliseconds poll = std::chrono::seconds(1));

  /**
   * @brief Follows election `name`: calls `on_change` with the current leader (nothing when
   *        there is none) at once, then after each change (await_change()), on a thread of its
   *        own, until the returned watch is stopped or destroyed.
   *
   * The watch keeps one entry in the election's queue of followers for its life and is woken as
   * await_change() is. Calls never overlap and come in order. An exception thrown by
   * `on_change`, and a database error (the watch goes on, reading again after `poll`), are
   * reported to the database's
   * listener (listener::log()). The callback must not destroy or stop its own watch.
   * @throws dblock::error errc::invalid_argument for a bad name, poll or an empty callback.
   */
  static leader_watch watch(const database& db, const std::string& name,
                            std::function<void(const std::optional<leader_info>&)> on_change,
                            std::chrono::milliseconds poll = std::chrono::seconds(1));

  /// The election's name.
  const std::string& name() const noexcept;
  /// This candidate's identity.
  const std::string& identity() const noexcept;
  /// The lease name of election `name`'s leadership (as list_locks() shows it, and for
  /// force_release()). @throws dblock::error errc::invalid_argument for a bad name.
  static std::string lease_name(const std::string& name);
  /// The election name of a leadership's lease name; nothing for any other name.
  static std::optional<std::string> election_of(const std::string& lease_name);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace dblock
