#include "dialect/host_doorbell.hpp"

#include <fcntl.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace dblock::detail {

std::string ring_entry(std::uint64_t hash, std::int64_t fence, const std::string& head) {
  if (head.empty() || head.size() > 64) return {};
  for (const char c : head)  // an entry name, never a path
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return {};
  char entry[128];
  std::snprintf(entry, sizeof entry, "%016llx.%lld.%s", static_cast<unsigned long long>(hash),
                static_cast<long long>(fence), head.c_str());
  return entry;
}

bool parse_ring_entry(const char* name, ring_event& ev) {
  unsigned long long hash = 0;
  long long fence = 0;
  char head[65] = {0};
  if (std::sscanf(name, "%16llx.%lld.%64s", &hash, &fence, head) != 3) return false;
  ev.hash = hash;
  ev.fence = fence;
  ev.head = head == any_waiter ? std::string() : std::string(head);
  if (head[0] == 'g') {  // granted_head()
    char* end = nullptr;
    const long long ticket = std::strtoll(head + 1, &end, 10);
    if (end == head + 1 || *end != '\0' || ticket <= 0) return false;
    ev.granted_ticket = ticket;
    ev.head.clear();
  }
  return true;
}

std::string granted_head(std::int64_t ticket) {
  return "g" + std::to_string(ticket);
}

bool hex_digits(const std::string& s, std::size_t n) {
  return s.size() == n && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool touch_entry(const std::string& dir, const std::string& name) {
  if (name.empty()) return false;
  const std::string path = dir + "/" + name;
  const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(path.c_str());
  return true;
}

namespace {

// Makes `dir` (mode 0700) when missing; true when it is a directory of this user that nobody
// else can read or write (ring entries name waiters' owner tokens).
bool private_dir(const std::string& dir, std::string& why) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    why = "cannot create " + dir + ": " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    why = "cannot read " + dir + ": " + std::strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    why = dir + " is not a directory of this user that only it can use (mode 0700)";
    return false;
  }
  return true;
}

}  // namespace

std::string private_runtime_dir(std::string& why) {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  std::string dir;
  if (xdg && *xdg == '/') {
    std::string ignored;
    if (private_dir(xdg, ignored)) dir = std::string(xdg) + "/dblock";
  }
  if (!dir.empty()) return private_dir(dir, why) ? dir : std::string();
  // Memory-backed where the system has it: a ring creates and removes an entry, which costs a
  // disk-backed /tmp a journal update each (about 50 us more per handoff, measured).
  const std::string uid = std::to_string(::geteuid());
  struct stat shm {};
  if (::stat("/dev/shm", &shm) == 0 && S_ISDIR(shm.st_mode) && (shm.st_mode & S_ISVTX) &&
      ::access("/dev/shm", W_OK | X_OK) == 0) {
    std::string ignored;
    if (private_dir("/dev/shm/dblock-" + uid, ignored)) return "/dev/shm/dblock-" + uid;
  }
  dir = "/tmp/dblock-" + uid;
  return private_dir(dir, why) ? dir : std::string();
}

dir_watch::dir_watch() : fd_(::inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) {}

dir_watch::~dir_watch() {
  if (fd_ >= 0) ::close(fd_);
}

int dir_watch::add(const std::string& dir, std::uint32_t mask) {
  return fd_ < 0 ? -1 : ::inotify_add_watch(fd_, dir.c_str(), mask);
}

void dir_watch::remove(int wd) {
  if (fd_ >= 0 && wd >= 0) ::inotify_rm_watch(fd_, wd);
}

void dir_watch::read(const std::function<void(int, std::uint32_t, const char*)>& on) {
  alignas(inotify_event) char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) return;
    for (ssize_t off = 0; off < n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(buf + off);
      off += static_cast<ssize_t>(sizeof(inotify_event) + e->len);
      on(e->wd, e->mask, e->len ? e->name : "");
    }
  }
}

}  // namespace dblock::detail
