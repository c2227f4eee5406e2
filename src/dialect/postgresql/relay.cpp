// PostgreSQL wake-ups through one listener per host (database_options::share_listener).
// PostgreSQL signals every listening backend of the database at each NOTIFY, whatever its
// channel, so with a listener per handle every release costs as many signalled backends as
// there are waiting handles. Here the handles of this host that connect alike share a private
// directory, <runtime dir>/pg-<hash of the listener's conninfo> (host_doorbell.hpp):
// - `bell`: the host's bell, 16 hex digits, made once. A waiter's queue entry carries
//   "<host bell>.<handle>" (32 characters, the handle 15 random hex digits); the release
//   notifies dblock_w_<host bell> with the payload "<fence>:<head token>@<handle>:<name>"
//   (vocabulary::release_returning()); but a release given this directory's bell as :bell
//   (its process meets here too) returns the handle instead, and its process creates the ring
//   entry itself (ring_relay_handle()), without a NOTIFY.
// - `leader`: one handle with waiters holds flock(LOCK_EX) on it, LISTENs, and writes
//   "listening <host bell>" into it while its LISTEN is in place. It relays each notification to
//   the handle it names, as a ring entry in that handle's directory h.<handle>, which only that
//   handle watches (no herd); rings for its own waiters it delivers at once.
// - Every other handle with waiters watches the directory with inotify: the leader file's
//   content tells it whether rings reach it (live), and the close of the leader's writable
//   descriptor (it resigned, or its process ended) makes it try to lead, as does a check every
//   second. A new leader, once listening, creates lost.<random>: rings meanwhile went unheard,
//   so every waiter of the host looks again.
// A leader resigns a second after its own last waiter left. Correctness never depends on a ring:
// a waiter that rings do not reach polls, as with a listener per handle (doorbell.cpp).
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "backend.hpp"
#include "dialect/common.hpp"
#include "dialect/host_doorbell.hpp"

namespace dblock::detail::pg {
namespace {

/// How long a handle stays in the relay (and a leader leads) after its last waiter left.
constexpr auto linger = std::chrono::seconds(1);
/// How often a handle with waiters checks the leader without being told.
constexpr int recheck_ms = 1000;
constexpr std::size_t handle_digits = 15;

// The leader's lock and writable descriptors, closed in a forked child: a child that kept them
// would keep the lock (flock belongs to the open file) and hold off the next leader after its
// parent ended. A descriptor is opened and remembered under fork_mu, which fork() takes first
// (pthread_atfork), so that no child is forked between the two.
std::mutex fork_mu;
std::atomic<int> inherited[1024];  // descriptor + 1; 0: free

void close_inherited() {
  for (auto& a : inherited) {
    const int v = a.load();
    if (v > 0) ::close(v - 1);
  }
}

/// open(2) of a descriptor that a forked child does not keep; -1 (errno set) when it failed or
/// there are too many to track (EMFILE).
int open_private(const std::string& path, int flags) {
  static std::once_flag once;
  std::call_once(once, [] {
    ::pthread_atfork([] { fork_mu.lock(); }, [] { fork_mu.unlock(); },
                     [] {
                       close_inherited();
                       fork_mu.unlock();
                     });
  });
  std::lock_guard<std::mutex> l(fork_mu);
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return -1;
  for (auto& a : inherited) {
    int free = 0;
    if (a.compare_exchange_strong(free, fd + 1)) return fd;
  }
  ::close(fd);
  errno = EMFILE;
  return -1;
}

void close_remembered(int& fd) {
  if (fd < 0) return;
  for (auto& a : inherited) {
    int v = fd + 1;
    if (a.compare_exchange_strong(v, 0)) break;
  }
  ::close(fd);
  fd = -1;
}

/// The host bell in `dir`, made when missing (atomically: link() of a complete file); empty when
/// it cannot be read or made.
std::string host_bell(const std::string& dir) {
  const std::string path = dir + "/bell";
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      char b[bell_digits + 1] = {0};
      const ssize_t n = ::read(fd, b, bell_digits);
      ::close(fd);
      const std::string bell(b, n > 0 ? static_cast<std::size_t>(n) : 0);
      return hex_digits(bell, bell_digits) ? bell : std::string();
    }
    if (errno != ENOENT) return {};
    const std::string tmp = path + "." + random_hex32();
    const int w = ::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (w < 0) return {};
    const std::string bell = random_hex32().substr(0, bell_digits);
    const bool written = ::write(w, bell.data(), bell.size()) == static_cast<ssize_t>(bell.size());
    ::close(w);
    const bool linked = written && (::link(tmp.c_str(), path.c_str()) == 0 || errno == EEXIST);
    ::unlink(tmp.c_str());
    if (!linked) return {};
  }
  return {};
}

class relay final : public listening_channel {
 public:
  relay(std::string conninfo, std::string dir, std::string host, bell_callbacks cb)
      : listening_channel(std::move(conninfo), std::move(cb), "wake-up relay"),
        dir_(std::move(dir)),
        host_(std::move(host)),
        handle_(random_hex32().substr(0, handle_digits)),
        handle_id_(std::strtoull(handle_.c_str(), nullptr, 16)),
        sub_(dir_ + "/h." + handle_) {
    if (watch_.ok()) start();
  }
  ~relay() override { stop(); }
  /// False without inotify (inotify_init1() failed): the handle then listens alone.
  bool usable() const { return watch_.ok(); }
  std::string address() const override { return host_ + "." + handle_; }
  bool is_self(std::int64_t id) const override {
    return static_cast<unsigned long long>(id) == handle_id_;
  }

 private:
  std::string leader_path() const { return dir_ + "/leader"; }

  /// Rings reach this handle's waiters (`on`) or may not: confirms them, or reports them
  /// unreachable (they poll until confirmed again).
  void set_live(bool on) {
    if (on) {
      live_.store(true);
      watched_.confirm(cb_.confirmed);
    } else if (live_.exchange(false)) {
      watched_.unconfirm_all(cb_.confirmed);
    }
  }

  /// Makes and watches h.<handle>, watches the directory and opens the leader file.
  bool activate() {
    if (active_) return true;
    if (!watch_.ok()) return false;
    if (::mkdir(sub_.c_str(), 0700) != 0 && errno != EEXIST) {
      log("cannot create " + sub_ + " (" + std::strerror(errno) + "); waiters poll meanwhile");
      return false;
    }
    sub_wd_ = watch_.add(sub_, IN_CREATE);
    dir_wd_ = watch_.add(dir_, IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE);
    if (lock_fd_ < 0) lock_fd_ = open_private(leader_path(), O_RDONLY | O_CREAT);
    if (sub_wd_ < 0 || dir_wd_ < 0 || lock_fd_ < 0) {
      log("cannot watch " + dir_ + " (" + std::strerror(errno) + "); waiters poll meanwhile");
      deactivate();
      return false;
    }
    active_ = true;
    return true;
  }
  void deactivate() {
    if (leader_) resign();
    watch_.remove(sub_wd_);
    watch_.remove(dir_wd_);
    sub_wd_ = dir_wd_ = -1;
    ::rmdir(sub_.c_str());
    set_live(false);
    active_ = false;
  }

  /// Leads when nobody does (this handle has waiters). False when the lock was free but
  /// leading failed: then nobody leads, whatever the leader file says.
  bool try_lead() {
    if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) return true;
    set_live(false);  // its waiters relied on the leader that ended; they poll until it listens
    write_fd_ = open_private(leader_path(), O_WRONLY);
    if (write_fd_ < 0) {
      log("cannot open " + leader_path() + " (" + std::strerror(errno) +
          "); waiters poll meanwhile");
      ::flock(lock_fd_, LOCK_UN);
      return false;
    }
    mark_listening(false);  // a leader that ended left "listening" behind
    leader_ = true;
    return true;
  }
  /// The leader file says "listening <host bell>" while the leader's LISTEN is in place.
  std::string listening_mark() const { return "listening " + host_ + "\n"; }
  void mark_listening(bool on) {
    const std::string m = listening_mark();
    if (on ? ::pwrite(write_fd_, m.data(), m.size(), 0) < 0 : ::ftruncate(write_fd_, 0) != 0)
      log(std::string("cannot write ") + leader_path() + ": " + std::strerror(errno));
  }
  /// Stops listening and leading; the handles that wait take over (they see the close).
  void resign() {
    if (conn_ && listening_ && !link_.command(conn_, "UNLISTEN *")) drop_connection();
    listening_ = false;
    set_live(false);
    mark_listening(false);
    ::flock(lock_fd_, LOCK_UN);
    close_remembered(write_fd_);
    leader_ = false;
  }
  /// A follower: whether the leader's LISTEN is in place, on this host's bell (a bell file
  /// removed and made again names another channel).
  bool leader_listening() const {
    const std::string want = listening_mark();
    char b[64] = {0};
    const ssize_t n = ::pread(lock_fd_, b, sizeof b - 1, 0);
    return n == static_cast<ssize_t>(want.size()) && want == b;
  }
  void drop_connection() {
    if (conn_) PQfinish(conn_);
    conn_ = nullptr;
    listening_ = false;
  }
  /// The leader connects and listens when it does not yet; false when that failed.
  bool listen() {
    if (!conn_ && !(conn_ = link_.connect())) return false;
    if (listening_) return true;
    if (!link_.command(conn_, "LISTEN " + bell_listen(host_))) {
      drop_connection();
      return false;
    }
    listening_ = true;
    mark_listening(true);
    set_live(true);
    // Rings while no leader listened went unheard: every waiter of the host looks again, this
    // handle's too (they may have relied on a leader that ended before relaying a ring).
    own_lost_ = "lost." + random_hex32();
    touch_entry(dir_, own_lost_);
    cb_.lost();
    return true;
  }
  /// The leader's connection broke.
  void connection_lost() {
    if (!stop_.load()) log(std::string("connection lost, reconnecting: ") + PQerrorMessage(conn_));
    drop_connection();
    mark_listening(false);
    set_live(false);
    cb_.lost();  // its own waiters look again now (the others when it listens again)
  }
  void relay_notifications() {
    while (PGnotify* n = PQnotifies(conn_)) {
      const std::string p = n->extra ? n->extra : "";
      PQfreemem(n);
      ring_event ev;
      std::string to;
      if (!parse_ring_payload(p, ev, to)) continue;
      if (to.empty() || to == handle_) {
        cb_.deliver(ev);
      } else if (hex_digits(to, handle_digits) &&
                 !touch_entry(dir_ + "/h." + to,
                              ring_entry(name_hash(ev.name), ev.fence, ev.head)) &&
                 errno != ENOENT) {  // ENOENT: that handle has no waiter any more
        log("cannot ring through " + dir_ + " (" + std::strerror(errno) +
            "); every waiter of this host looks again");
        touch_entry(dir_, "lost." + random_hex32());
        cb_.lost();
      }
    }
  }
  void on_event(int wd, std::uint32_t mask, const char* name) {
    if (mask & IN_Q_OVERFLOW) {
      cb_.lost();
      return;
    }
    // A watched directory was removed (not a watch this thread removed itself, whose
    // IN_IGNORED comes later with a number no longer in use): made and watched again next round.
    if ((mask & IN_IGNORED) && wd >= 0 && (wd == sub_wd_ || wd == dir_wd_)) {
      if (wd == sub_wd_) sub_wd_ = -1;
      if (wd == dir_wd_) dir_wd_ = -1;
      if (leader_) resign();
      watch_.remove(sub_wd_);
      watch_.remove(dir_wd_);
      sub_wd_ = dir_wd_ = -1;
      set_live(false);
      active_ = false;
      cb_.lost();
      return;
    }
    ring_event ev;
    if (wd == sub_wd_ && *name && parse_ring_entry(name, ev)) cb_.deliver(ev);
    if (wd == dir_wd_ && (mask & IN_CREATE) && std::strncmp(name, "lost.", 5) == 0 &&
        own_lost_ != name)
      cb_.lost();
    // A change of the leader file needs nothing here: every round reads it.
  }
  void run() override {
    using clock = std::chrono::steady_clock;
    auto idle_since = clock::now();
    int backoff_ms = 10;
    while (!stop_.load()) {
      const bool want = wanted();
      if (want) idle_since = clock::now();
      const auto idle = clock::now() - idle_since;
      if (!want && idle >= linger) {
        if (active_) deactivate();
        poke_.wait(-1, -1);  // until a waiter comes (or the handle closes)
        continue;
      }
      int ms = recheck_ms;
      if (activate()) {
        const bool someone_may_lead = leader_ || !want || try_lead();
        if (leader_ && listen()) {
          backoff_ms = 10;
        } else if (leader_) {
          ms = backoff_ms;
          backoff_ms = std::min(backoff_ms * 2, 1000);
        } else {
          set_live(someone_may_lead && leader_listening());
        }
        if (live_.load()) watched_.confirm(cb_.confirmed);
      }
      if (!want)
        ms = std::min(
            ms, static_cast<int>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(linger - idle).count()) +
                    1);
      const int fds[2] = {watch_.fd(), leader_ && conn_ ? PQsocket(conn_) : -1};
      const unsigned ready = poke_.wait_any(fds, 2, ms);
      if (ready & 1u)
        watch_.read(
            [this](int wd, std::uint32_t mask, const char* name) { on_event(wd, mask, name); });
      if ((ready & 2u) && conn_) {
        if (!PQconsumeInput(conn_))
          connection_lost();
        else
          relay_notifications();
      }
    }
    if (active_) deactivate();
    drop_connection();
    close_remembered(lock_fd_);
  }

  const std::string dir_, host_, handle_;
  const unsigned long long handle_id_;  // handle_ as the number a release returns
  const std::string sub_;
  // The thread's own state.
  dir_watch watch_;
  int sub_wd_ = -1, dir_wd_ = -1, lock_fd_ = -1, write_fd_ = -1;
  bool active_ = false, leader_ = false, listening_ = false;
  PGconn* conn_ = nullptr;
  std::string own_lost_;
};

}  // namespace

namespace {

/// What decides where the handles that connect with `conninfo` meet: libpq fills in what the
/// conninfo leaves out from the environment, so handles that connect alike have the same
/// conninfo and the same of these; and the runtime directory's.
std::string relay_key(const std::string& conninfo) {
  std::string key = conninfo;
  for (const char* v : {"PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE",
                        "PGSERVICEFILE", "PGOPTIONS", "PGSYSCONFDIR", "XDG_RUNTIME_DIR"}) {
    const char* x = std::getenv(v);
    key += std::string("\n") + v + "=" + (x ? x : "");
  }
  return key;
}

/// The relay directory for `key` (made when missing); empty (and `why` set) when there is no
/// usable private runtime directory.
std::string relay_directory(const std::string& key, std::string& why) {
  const std::string base = private_runtime_dir(why);
  if (base.empty()) return {};
  char h[24];
  std::snprintf(h, sizeof h, "/pg-%016llx", static_cast<unsigned long long>(name_hash(key)));
  const std::string dir = base + h;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    why = "cannot create " + dir + ": " + std::strerror(errno);
    return {};
  }
  return dir;
}

struct known_relay {
  std::string dir, bell;
};

/// The directory and bell of `conninfo`'s relay, looked up once (a release is on the handoff's
/// path); nothing when there is no usable directory.
std::optional<known_relay> relay_of(const std::string& conninfo) {
  static std::mutex mu;
  static std::map<std::string, known_relay> known;
  const std::string key = relay_key(conninfo);
  std::lock_guard<std::mutex> l(mu);
  const auto it = known.find(key);
  if (it != known.end()) return it->second;
  std::string why;
  known_relay r;
  r.dir = relay_directory(key, why);
  if (r.dir.empty() || (r.bell = host_bell(r.dir)).empty()) return std::nullopt;
  if (known.size() >= 64) known.clear();
  known.emplace(key, r);
  return r;
}

}  // namespace

std::string relay_host_bell(const std::string& conninfo) {
  const auto r = relay_of(conninfo);
  return r ? r->bell : std::string();
}

bool ring_relay_handle(const std::string& conninfo, const std::string& name, std::int64_t fence,
                       std::int64_t handle, std::int64_t granted_ticket) {
  if (handle <= 0 || handle >= (std::int64_t{1} << (4 * handle_digits))) return false;
  const auto r = relay_of(conninfo);
  if (!r) return false;
  char sub[32];
  std::snprintf(sub, sizeof sub, "/h.%015llx", static_cast<unsigned long long>(handle));
  // No such directory: that handle has no waiters any more.
  return touch_entry(r->dir + sub,
                     ring_entry(name_hash(name), fence,
                                granted_ticket > 0 ? granted_head(granted_ticket) : any_waiter));
}

std::unique_ptr<bell_channel> open_relay(const std::string& conninfo, bell_callbacks& cb) {
  std::string why;
  const std::string dir = relay_directory(relay_key(conninfo), why);
  std::string host;
  if (!dir.empty() && (host = host_bell(dir)).empty()) why = "cannot read or make " + dir + "/bell";
  if (host.empty()) {
    if (cb.log) cb.log(log_level::warning, "wake-up relay: " + why + "; this handle listens alone");
    return nullptr;
  }
  auto r = std::make_unique<relay>(conninfo, dir, host, cb);
  if (r->usable()) return r;
  if (cb.log)
    cb.log(log_level::warning,
           "wake-up relay: inotify is not available; this handle listens alone");
  return nullptr;
}

}  // namespace dblock::detail::pg
