#include "lease/fenced.hpp"

#include <algorithm>

#include "core/identifier.hpp"
#include "storage/deadline.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock::detail {

void fenced_write(const std::vector<lease_state*>& leases,
                  const std::function<void(session_scope&)>& write, const std::string& what) {
  if (leases.empty()) throw error(errc::not_owner, what + ": no lease is held");
  const lease_state* tightest = *std::min_element(
      leases.begin(), leases.end(),
      [](const lease_state* a, const lease_state* b) { return a->call_bound() < b->call_bound(); });
  const call_deadline bound(tightest->call_bound(), tightest->call_bound_what());
  if (leases.front()->session_mode) {
    // A session lease is proven by the session that holds it: one lease per transaction.
    if (leases.size() != 1)
      throw error(errc::invalid_argument, what + ": a fenced write proves one session lease");
    return leases.front()->pinned_write(write, what);
  }
  lease_state* lost = nullptr;
  try {
    write_transaction(leases.front()->db, what, std::nullopt, [&](session_scope& s) {
      for (lease_state* l : leases) {
        const auto fence = lock_table::fenced_check(s, l->name, l->token);
        if (!fence || *fence != l->fence) {
          lost = l;
          throw error(errc::lease_lost, what + ": the lease on '" + printable(l->name) +
                                            "' is no longer ours; nothing was written");
        }
      }
      write(s);
    });
  } catch (const error& e) {
    // Reported once the transaction is over (the reason is read on another connection).
    if (lost) lost->mark_lost(e, lost->read_loss());
    throw;
  }
}

void fenced_user_write(const std::vector<lease_state*>& leases,
                       const std::function<void(soci::session&)>& write, const std::string& what) {
  fenced_write(
      leases,
      [&](session_scope& s) {
        try {
          write(s.sql());
        } catch (const soci::soci_error&) {
          throw s.failure(what);
        }
      },
      what);
}

}  // namespace dblock::detail
