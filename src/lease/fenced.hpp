// Internal: the one fenced write. Every write that must land only while leases are ours goes
// through it: lease_guard::fenced(), lock_set_guard::fenced(), a leader's announcement, the run
// records (kinds/runs.cpp) and leave_session_mode().
#pragma once

#include <soci/soci.h>

#include <functional>
#include <string>
#include <vector>

#include "lease/state.hpp"

namespace dblock::detail {

/// One write transaction that proves every lease of `leases` and then runs `write`; COMMIT lands
/// only while all are ours (a lost COMMIT reply is errc::in_doubt, never sent again).
/// - Row leases: each lock row is locked and checked (owner token, fence, unexpired) in the
///   order given (a lock set's global order), on a pooled connection.
/// - A session lease (one at most): the transaction runs on its holding session, which commits
///   only while the session, and the session lock with it, lives.
/// Bound, for every kind: the lease's call_bound() (TTL less its safety margin, at least 1 s),
/// the smallest of them, never the database's call_timeout: a write on a held lease ends before
/// the lease would, and successors never wait on its row locks past it.
/// A lease found no longer ours: errc::lease_lost, nothing written, its loss reported once the
/// transaction is over. No lease: errc::not_owner.
void fenced_write(const std::vector<lease_state*>& leases,
                  const std::function<void(session_scope&)>& write, const std::string& what);

/// fenced_write() with the caller's own statements: their SOCI errors are classified as dblock's.
void fenced_user_write(const std::vector<lease_state*>& leases,
                       const std::function<void(soci::session&)>& write, const std::string& what);

}  // namespace dblock::detail
