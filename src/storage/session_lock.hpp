// Internal: a lease held as a server session lock (PostgreSQL, MariaDB; the statements are the
// dialect's, vocabulary::session_leases()). The exclusion is the session-level advisory
// lock of a key the server hashes from the table prefix and the name; the fence is the name's
// marker fence plus the next value of a sequence. A name in session mode has a marker: its lock
// row, held for good by session_mode_token, so a durable lease of the name is refused while it
// is in session mode, and its session fences start above every durable fence it had.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "storage/session.hpp"

namespace dblock::detail::session_lock {

/// The owner token of a marker row (no random token is all zeros but with chance 2^-128).
inline const std::string session_mode_token(32, '0');

/// What a try returned.
struct tried {
  enum kind_t { granted, held, unmarked } kind;
  std::int64_t fence = 0;
};

/// On the session `s` that will hold it: takes the session lock of `name` without waiting and
/// reads its fence (one statement); granted, the server ends the session when it idles past
/// `ttl_ms`. `unmarked`: the name has no marker; the lock is not kept.
tried try_lock(session_scope& s, const std::string& name, std::int64_t ttl_ms);
/// The server's limit on the next lock wait of session `s`: `wait_ms` (at least 1).
void set_lock_timeout(session_scope& s, std::int64_t wait_ms);
/// Waits in the server's own lock queue (FIFO) for the session lock of `name`, up to the limit
/// set_lock_timeout() set (then the server's lock_timeout error is thrown); granted or
/// `unmarked` as try_lock(), and the limit back to none. A failure may leave the lock held by
/// the session: the caller then drops the connection (which ends the session).
tried wait_lock(session_scope& s, const std::string& name, std::int64_t ttl_ms);
/// Why the server of session `s` cannot keep session leases (Galera: a session lock is local to
/// one node; the end of "lease_mode::session ..."), or nullptr when it can.
const char* refusal(session_scope& s);
/// Gives the session lock of `name` back (the idle timeouts stay for the connection's next grant;
/// the pool resets them for any other use); false when this session
/// did not hold it.
bool unlock(session_scope& s, const std::string& name);
/// A server session holding or waiting for the session lock of a name.
struct server_session {
  std::int64_t pid = 0;                   ///< the server's process id
  std::string client;                     ///< its client's address ("local": a Unix socket)
  bool holds = false;                     ///< holds the lock (else waits for it)
  std::int64_t since_us = 0, now_us = 0;  ///< start of its statement; the database's now
  /// The holder's report (report()): its fence (0: none made yet), grant time (µs), and the
  /// client's host, process id and thread.
  std::int64_t fence = 0, acquired_us = 0;
  std::string host;
  std::int64_t client_pid = 0;
  std::string thread;
};
/// What a holding session reports of its hold, for status.
struct hold_report {
  std::int64_t fence = 0;
  std::int64_t held_us = 0;  ///< how long it has been held (the grant's time is the server's now
                             ///< less this)
  std::string host;
  std::int64_t pid = 0;
  std::string thread;
};
/// On the holding session `s`: reports its hold of `name` (one statement, which also renews the
/// lease). A failure that leaves the session alive (a missing privilege) is ignored: false.
bool report(session_scope& s, const std::string& name, const hold_report& r);
/// On the holding session `s`, after the unlock: deletes its report of `name`.
void unreport(session_scope& s, const std::string& name);
/// The sessions holding, then waiting for, the session lock of `name` (waiters by arrival).
std::vector<server_session> sessions(session_scope& s, const std::string& name);
/// Ends the server session `pid` (and so its locks); true once it is gone.
bool end_session(session_scope& s, std::int64_t pid);
/// True when `owner_token` is a marker's: the name is in session mode.
inline bool is_marker(const std::string& owner_token) {
  return owner_token == session_mode_token;
}
/// Makes `name`'s marker when its lock row is free (one acquire); false when a durable lease
/// holds it.
bool mark(session_scope& s, const std::string& name);
/// On the session holding `name`'s session lock at `fence` (above every session fence the name
/// had): frees its marker row with that fence and a fresh owner `token`, so the name is back in
/// row mode and its next row-mode fence is above `fence`; false when it had no marker.
bool unmark(session_scope& s, const std::string& name, std::int64_t fence,
            const std::string& token);

}  // namespace dblock::detail::session_lock
