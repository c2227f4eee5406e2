// Internal: what a pooled connection keeps for session leases (storage/session_lock.hpp), part of
// its connection_state.
#pragma once

#include <chrono>
#include <cstdint>

namespace dblock::detail {

struct session_lease_state {
  /// This connection moved the fence sequence 2^32 ahead (session_lock.cpp, raise_once()).
  bool fence_moved = false;
  /// The idle timeout a grant set in a statement of its own and left in place after the release,
  /// as the server counts it: ms, 0 for the server's default.
  /// The pool hands such a connection to another session lease as it is, resets it for any other
  /// use, and drops it once it has idled nearly that long (the server may have ended it).
  std::int64_t idle_ms = 0;
  /// When the connection last went back to the pool (set while idle_ms is not 0).
  std::chrono::steady_clock::time_point idle_since;
};

}  // namespace dblock::detail
