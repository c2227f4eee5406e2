// Internal: the pieces of a host-local doorbell, a directory whose entries ring waiters of other
// processes of this host through inotify (SQLite's doorbell beside the database file, and the
// PostgreSQL wake-up relay, postgresql/relay.cpp). A ring is an entry created and at once
// removed: "<name hash, 16 hex>.<fence>.<head owner token>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "dialect/dialect.hpp"

namespace dblock::detail {

/// The head of a ring that names no waiter: the one of the lowest ticket among the waiters of
/// the name that the ring reaches (parse_ring_entry() gives an empty head).
inline const std::string any_waiter = "_";
/// The head of a ring that hands the lease to the waiter with queue ticket `ticket`
/// (ring_event::granted_ticket): "g<ticket>" (an owner token is hexadecimal, never "g...").
std::string granted_head(std::int64_t ticket);
/// The entry name of a ring (see the file comment); empty when `head` is not 1..64 letters,
/// digits, `_` or `-`.
std::string ring_entry(std::uint64_t hash, std::int64_t fence, const std::string& head);
/// Parses an entry name made by ring_entry(); false for any other name.
bool parse_ring_entry(const char* name, ring_event& ev);
/// The digits of a handle's bell in a host doorbell directory (SQLite's h.<bell>, the host bell
/// of PostgreSQL's relay).
constexpr std::size_t bell_digits = 16;
/// True when `s` is `n` lowercase hexadecimal digits (a bell or handle id made here, safe as a
/// path component).
bool hex_digits(const std::string& s, std::size_t n);
/// Rings through directory `dir`: creates the entry `name` in it and removes it again. False
/// when it could not be created (no directory: nobody listens there).
bool touch_entry(const std::string& dir, const std::string& name);

/// A directory of this host that only this user can write, made when missing:
/// $XDG_RUNTIME_DIR/dblock when that is set, else /dev/shm/dblock-<uid> where /dev/shm is a
/// shared directory (memory-backed), else /tmp/dblock-<uid>. Empty (and `why` set)
/// when it cannot be made or is not safe (not a directory, another owner, open to others: the
/// mode must be 0700).
std::string private_runtime_dir(std::string& why);

/// inotify on a few directories, read on the caller's thread. Not thread-safe.
class dir_watch {
 public:
  dir_watch();
  ~dir_watch();
  dir_watch(const dir_watch&) = delete;
  dir_watch& operator=(const dir_watch&) = delete;
  /// False when inotify is not available (see error()).
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  /// Watches `dir` for `mask` (IN_CREATE, ...); the watch descriptor, or -1 (errno set).
  int add(const std::string& dir, std::uint32_t mask);
  /// Stops watch `wd` (no-op for -1).
  void remove(int wd);
  /// Reads what is pending (non-blocking) and calls `on` for each event: its watch descriptor,
  /// mask and entry name (empty for the directory itself).
  void read(const std::function<void(int wd, std::uint32_t mask, const char* name)>& on);

 private:
  int fd_ = -1;
};

}  // namespace dblock::detail
