// Round trips per operation, for dblock-bench: the number of send() calls this thread made.
// dblock-bench defines send() itself (round_trips.cpp), counting each call on the calling
// thread before passing it on to the C library's; libpq and MariaDB Connector/C write every
// request (a simple query, or Parse/Bind/Execute/Sync together) with one send() and then wait
// for its reply, so sends per operation are round trips per operation. SQLite sends nothing.
#pragma once

#include <cstdint>

namespace dblock::bench {

/// send() calls made so far on the calling thread.
std::uint64_t sends_on_this_thread() noexcept;

}  // namespace dblock::bench
