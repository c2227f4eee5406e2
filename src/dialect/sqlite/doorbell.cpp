// SQLite wake-ups. All users of a SQLite file share a host, so the doorbell is a directory beside
// the database file: a release creates (and at once removes) an entry named after the hash of
// the resource name, the freed fence and the owner token of the head of the waiter queue (the
// releaser reads it; no entry when nobody waits), and each process with waiters watches the
// directory with inotify on one thread per database handle; only the process of the head
// wakes it. A lost ring costs latency only.
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
#include "dialect/host_doorbell.hpp"
#include "url.hpp"

namespace dblock::detail::lite {
namespace {

class channel final : public bell_channel {
 public:
  channel(std::string dir, bell_callbacks cb) : dir_(std::move(dir)), cb_(std::move(cb)) {
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
  }
  bool live() const override { return live_.load(); }

 private:
  void log(const std::string& m) {
    if (cb_.log) cb_.log(log_level::warning, "wake-up doorbell: " + m);
  }
  /// Creates the directory if needed and watches it; live when that worked.
  void arm(bool report) {
    if ((::mkdir(dir_.c_str(), 0777) != 0 && errno != EEXIST) || watch_.add(dir_, IN_CREATE) < 0) {
      if (report)
        log("cannot watch " + dir_ + " (" + std::strerror(errno) + "); waiters poll instead");
      return;
    }
    live_.store(true);
    if (!report) cb_.lost();  // re-armed: rings meanwhile went unheard
  }
  void handle(std::uint32_t mask, const char* name) {
    if (mask & IN_Q_OVERFLOW) cb_.lost();
    if (mask & IN_IGNORED) {  // the directory was removed: poll until it is back
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
      watch_.read([this](int, std::uint32_t mask, const char* name) { handle(mask, name); });
    }
  }

  const std::string dir_;
  bell_callbacks cb_;
  int stop_fd_ = -1;
  dir_watch watch_;
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
                    const std::string& head) const {
  // No directory: no process has waited on this file yet, so nobody listens. No head: nobody
  // waits (ring_entry() is empty).
  touch_entry(target, ring_entry(name_hash(name), fence, head));
}

}  // namespace dblock::detail::lite
