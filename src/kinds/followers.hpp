// Internal: the followers of an election (election::await_change(), election::watch()) hear of a
// change of its leadership.
#pragma once

#include <memory>
#include <string>

namespace dblock::detail {

struct database_impl;

/// The leadership of `election` changed through `db` (won, resigned, lost, or released by force):
/// wakes its followers in this process at once and rings those of other processes through their
/// queue entries (a statement of up to 2 s; a failure is logged and costs only the wake-ups).
void ring_followers(const std::shared_ptr<database_impl>& db, const std::string& election) noexcept;

}  // namespace dblock::detail
