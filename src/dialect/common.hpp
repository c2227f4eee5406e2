// Internal helpers shared by the dialect implementations (not a dialect themselves).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "core/url.hpp"
#include "dblock/database.hpp"
#include "dblock/error.hpp"

namespace dblock::detail {

/// Quotes a value for a libpq/SOCI "key=value" connection string: '...' with \ and ' escaped.
std::string conn_quote(const std::string& value);

/// Throws errc::invalid_argument for a query key outside `allowed`.
void check_query_keys(const parsed_url& url, const std::set<std::string>& allowed);

/// The URL key connect_timeout (whole seconds as libpq and the MySQL client take them, or a
/// duration such as 1500ms) into `o.connect_timeout`, so that the connection string and the
/// deadline's lowering of it (database_impl::open) read one value; more than zero (zero means
/// "wait for ever" to both client libraries). Throws errc::invalid_argument.
void url_connect_timeout(const parsed_url& url, database_options& o);
/// Throws errc::invalid_argument unless the URL's value of `key`, when given, is whole seconds
/// (digits, at most 9), at least 1 (the client libraries read 0 as "no timeout").
void check_url_seconds(const parsed_url& url, const std::string& key);

/// Whole seconds, rounded up, at least `min`.
long long ceil_seconds(std::chrono::milliseconds ms, long long min = 1);
/// `connect_string` (keys as the connectors write them) with connect_timeout set to `seconds`.
std::string with_connect_timeout(const std::string& connect_string, long long seconds);

/// The current exception when it is a dblock::error (rethrown as is), else nothing.
void rethrow_if_dblock_error();

/// Drops a trailing newline and squeezes the backend message onto one line.
std::string one_line(std::string message);

/// True when `s` contains `needle` (ASCII case-insensitive).
bool contains_nocase(const std::string& s, const std::string& needle);

/// 32 random lower-case hex digits (a wake-up channel's bell).
std::string random_hex32();

/// How other threads wake a wake-up channel's thread (an eventfd): poke() from anywhere; the
/// channel's thread waits on it together with its connection's socket.
class poke_fd {
 public:
  poke_fd();
  ~poke_fd();
  poke_fd(const poke_fd&) = delete;
  poke_fd& operator=(const poke_fd&) = delete;
  void poke();
  /// Waits up to `ms` (-1: forever) for a poke or for socket `fd` (-1: none) to be readable
  /// (or broken); consumes the poke. True when the socket is.
  bool wait(int fd, int ms);
  /// The same with `n` descriptors (-1 entries are skipped): bit i of the result is set when
  /// `fds[i]` is readable (or broken).
  unsigned wait_any(const int* fds, int n, int ms);

 private:
  int fd_ = -1;
};

/// The waiters an addressed wake-up channel serves (bell_channel::watch()), and which of them
/// it has not yet confirmed as reachable. Thread-safe; `confirmed` is bell_callbacks::confirmed.
class watched_waiters {
 public:
  using confirm_fn = std::function<void(const std::string& token, bool)>;
  /// Adds (`on`, unconfirmed) or removes the waiter with owner token `token`.
  void watch(const std::string& token, bool on);
  /// True while there is a waiter.
  bool any() const;
  /// The token of the only waiter, if there is exactly one.
  std::optional<std::string> only() const;
  /// The channel can reach its waiters now: confirms those not yet confirmed.
  void confirm(const confirm_fn& confirmed);
  /// The channel's connection broke: every waiter is reported unreachable and will be
  /// confirmed again by the next connection.
  void unconfirm_all(const confirm_fn& confirmed);

 private:
  mutable std::mutex mu_;
  std::set<std::string> wanted_;       // tokens of the handle's waiters
  std::set<std::string> unconfirmed_;  // of those, not yet known to be reachable
};

}  // namespace dblock::detail
