// Internal: the connections of one dblock::database, lent one at a time (database_impl::lease()).
#pragma once

#include <soci/soci.h>

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace dblock::detail {

/**
 * A fixed set of connection slots, each lent to one user at a time. A thread is lent the slot it
 * had last when that one is free, else the free slot of the lowest index: so a thread that
 * borrows a connection again and again talks to the same server session, and the operating
 * system keeps the two together (a thread handed a different connection each time, as a plain
 * pool does, made the raw cycle of a session lease 20 % slower at 4 clients on 2 cores, with
 * twice the cross-CPU wake-ups: docs/performance.md).
 */
class connection_slots {
 public:
  explicit connection_slots(std::size_t n);
  connection_slots(const connection_slots&) = delete;
  connection_slots& operator=(const connection_slots&) = delete;
  /// Lends a slot (its index in `pos`), waiting up to `wait_ms` for one to be given back;
  /// false when none was.
  bool try_lease(std::size_t& pos, int wait_ms);
  /// Gives slot `pos` back.
  void give_back(std::size_t pos);
  /// The connection of slot `pos` (its lessee's alone).
  soci::session& at(std::size_t pos) { return *sessions_[pos]; }

 private:
  std::mutex mu_;
  std::condition_variable freed_;
  std::vector<std::unique_ptr<soci::session>> sessions_;
  std::vector<bool> busy_;
};

}  // namespace dblock::detail
