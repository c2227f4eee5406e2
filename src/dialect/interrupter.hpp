// Internal: how a connection that outlived its call's deadline is stopped (the dialect's side of
// storage/deadline.hpp).
#pragma once

#include <functional>

namespace dblock::detail {

/// What the sentinel does to a connection whose deadline passed (made by the dialect).
class interrupter {
 public:
  virtual ~interrupter() = default;
  /// Asks the server to stop what the connection runs. May block (a frozen server): it runs on
  /// a thread of its own and must own everything it uses. Empty: nothing to ask.
  virtual std::function<void()> cancel() { return {}; }
  /// Ends any blocking wait of the client library on this connection now (shutdown(2) of its
  /// socket, sqlite3_interrupt). Never blocks; called while the connection is still open.
  virtual void cut() noexcept = 0;
};

}  // namespace dblock::detail
