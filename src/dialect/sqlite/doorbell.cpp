// SQLite wake-ups. All users of a SQLite file share a host, so the doorbell is a directory beside
// the database file. Each database handle with waiters watches a directory of its own in it,
// h.<handle> (its waiters' queue entries carry <handle> as their bell), with inotify on one
// thread. A release creates (and at once removes) an entry named after the hash of the resource
// name, the freed fence and the owner token of the head of the waiter queue in the head's handle
// directory (the releaser reads both; no entry when nobody waits), so only the head's handle
// wakes, not every process that waits on the file. A head without a bell is rung in the doorbell
// directory itself, which every handle also watches. A lost ring costs latency only.
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "backend.hpp"
#include "core/url.hpp"
#include "dialect/common.hpp"
#include "dialect/host_doorbell.hpp"

namespace dblock::detail::lite {
namespace {

class channel final : public bell_channel {
 public:
  channel(std::string dir, bell_callbacks cb)
      : dir_(std::move(dir)),
        handle_(random_hex32().substr(0, bell_digits)),
        sub_(dir_ + "/h." + handle_),
        cb_(std::move(cb)) {
    stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!watch_.ok()) {
      log(std::string("inotify is not available (") + std::strerror(errno) +
          "); waiters poll instead");
      return;
    }
    arm(true);
    thread_ = std::thread([this] { run(); });
  }
  ~channel() override {
    const std::uint64_t one = 1;
    if (::write(stop_fd_, &one, sizeof one) < 0) {
    }
    if (thread_.joinable()) thread_.join();
    ::close(stop_fd_);
    ::rmdir(sub_.c_str());  // empty: a ring's entry is removed as soon as it was made
  }
  bool live() const override { return live_.load(); }
  std::string address() const override { return handle_; }

 private:
  void log(const std::string& m) {
    if (cb_.log) cb_.log(log_level::warning, "wake-up doorbell: " + m);
  }
  /// Creates the doorbell directory and this handle's own in it if needed and watches both; live
  /// when that worked.
  void arm(bool report) {
    const auto made = [](const std::string& d) {
      return ::mkdir(d.c_str(), 0777) == 0 || errno == EEXIST;
    };
    watch_.remove(dir_wd_);
    watch_.remove(sub_wd_);
    dir_wd_ = sub_wd_ = -1;
    if (!made(dir_) || (dir_wd_ = watch_.add(dir_, IN_CREATE)) < 0 || !made(sub_) ||
        (sub_wd_ = watch_.add(sub_, IN_CREATE)) < 0) {
      if (report)
        log("cannot watch " + sub_ + " (" + std::strerror(errno) + "); waiters poll instead");
      return;
    }
    live_.store(true);
    if (!report) cb_.lost();  // re-armed: rings meanwhile went unheard
  }
  void handle(int wd, std::uint32_t mask, const char* name) {
    if (mask & IN_Q_OVERFLOW) cb_.lost();
    // A watched directory was removed (not a watch that arm() removed itself, whose IN_IGNORED
    // comes later with a number no longer in use): poll until both are back.
    if ((mask & IN_IGNORED) && wd >= 0 && (wd == dir_wd_ || wd == sub_wd_)) {
      live_.store(false);
      cb_.lost();
    }
    ring_event ev;
    if (*name && parse_ring_entry(name, ev)) cb_.deliver(ev);
  }
  void run() {
    for (;;) {
      pollfd p[2] = {{stop_fd_, POLLIN, 0}, {watch_.fd(), POLLIN, 0}};
      ::poll(p, 2, live_.load() ? -1 : 100);
      if (p[0].revents & POLLIN) return;
      if (!live_.load()) arm(false);
      watch_.read([this](int wd, std::uint32_t mask, const char* name) { handle(wd, mask, name); });
    }
  }

  const std::string dir_, handle_, sub_;
  bell_callbacks cb_;
  int stop_fd_ = -1;
  dir_watch watch_;
  int dir_wd_ = -1, sub_wd_ = -1;
  std::atomic<bool> live_{false};
  std::thread thread_;
};

}  // namespace

std::string doorbell::target(const parsed_url& u, const database_options& o) const {
  detail::doorbell::target(u, o);  // refuses listen_url
  if (u.path.empty() || u.path == ":memory:" || u.path.rfind("file:", 0) == 0) return {};
  return u.path + ".dblock-wake";
}

std::unique_ptr<bell_channel> doorbell::open(const std::string& target, const table_names&,
                                             bell_callbacks cb) const {
  return std::make_unique<channel>(target, std::move(cb));
}

// No doorbell directory: no process has waited on this file yet, so nobody listens and the
// releaser need not read the head of the queue.
bool doorbell::rings_head(const std::string& target) const {
  return ::access(target.c_str(), F_OK) == 0;
}

void doorbell::ring(const std::string& target, const std::string& name, std::int64_t fence,
                    const std::string& head, const std::string& head_bell) const {
  // No directory: no process has waited on this file yet, so nobody listens. No head: nobody
  // waits (ring_entry() is empty). The head's handle directory gone: that handle has closed,
  // and its entry expires.
  const std::string entry = ring_entry(name_hash(name), fence, head);
  if (head_bell.empty()) {
    touch_entry(target, entry);
  } else if (hex_digits(head_bell, bell_digits)) {
    touch_entry(target + "/h." + head_bell, entry);
  }
}

}  // namespace dblock::detail::lite
