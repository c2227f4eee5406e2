#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include "common.hpp"
#include "fence_check.hpp"

#include <algorithm>
#include <cctype>
#include <exception>

#include "core/identifier.hpp"

namespace dblock::detail {

std::string conn_quote(const std::string& value) {
  std::string out = "'";
  for (char c : value) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}

void check_query_keys(const parsed_url& url, const std::set<std::string>& allowed) {
  for (const auto& kv : url.query) {
    if (!allowed.count(kv.first)) {
      std::string list;
      for (const auto& a : allowed)
        list += (list.empty() ? "" : ", ") + a;
      throw error(errc::invalid_argument, "invalid database URL '" + url.redacted +
                                              "': unknown parameter '" + kv.first +
                                              "' (accepted: " + list + ")");
    }
  }
}

namespace {
bool whole_seconds(const std::string& v) {
  return !v.empty() && v.size() <= 9 && v.find_first_not_of("0123456789") == std::string::npos;
}
}  // namespace

void check_url_seconds(const parsed_url& url, const std::string& key) {
  auto it = url.query.find(key);
  if (it != url.query.end() &&
      (!whole_seconds(it->second) || it->second.find_first_not_of('0') == std::string::npos))
    throw error(errc::invalid_argument, "invalid database URL '" + url.redacted + "': " + key +
                                            "='" + printable(it->second) +
                                            "' (expected whole seconds, at least 1)");
}

void url_connect_timeout(const parsed_url& url, database_options& o) {
  auto it = url.query.find("connect_timeout");
  if (it == url.query.end()) return;
  const auto t = whole_seconds(it->second)
                     ? std::chrono::milliseconds(std::stoll(it->second) * 1000)
                     : url_duration(url, it->first, it->second);
  if (t.count() <= 0)
    throw error(errc::invalid_argument,
                "invalid database URL '" + url.redacted +
                    "': connect_timeout must be more than 0 (0 would wait for ever)");
  // The client libraries read an int of seconds; a day is far above any useful connect.
  if (t > std::chrono::hours(24))
    throw error(errc::invalid_argument,
                "invalid database URL '" + url.redacted + "': connect_timeout must be at most 24h");
  o.connect_timeout = t;
}

long long ceil_seconds(std::chrono::milliseconds ms, long long min) {
  long long s = (ms.count() + 999) / 1000;
  return std::max(s, min);
}

void rethrow_if_dblock_error() {
  try {
    throw;
  } catch (const error&) {
    throw;
  } catch (...) {
  }
}

std::string one_line(std::string message) {
  for (char& c : message)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  while (!message.empty() && message.back() == ' ')
    message.pop_back();
  return message;
}

bool contains_nocase(const std::string& s, const std::string& needle) {
  auto it = std::search(s.begin(), s.end(), needle.begin(), needle.end(), [](char a, char b) {
    return std::tolower(static_cast<unsigned char>(a)) ==
           std::tolower(static_cast<unsigned char>(b));
  });
  return it != s.end();
}

std::string random_hex32() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<std::uint64_t>(rd()) << 32) ^ rd());
  static const char* hex = "0123456789abcdef";
  std::string m;
  for (int i = 0; i < 32; ++i)
    m += hex[g() & 15];
  return m;
}

poke_fd::poke_fd() : fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

poke_fd::~poke_fd() {
  ::close(fd_);
}

void poke_fd::poke() {
  const std::uint64_t one = 1;
  if (::write(fd_, &one, sizeof one) < 0) {
  }
}

bool poke_fd::wait(int fd, int ms) {
  return wait_any(&fd, 1, ms) != 0;
}

unsigned poke_fd::wait_any(const int* fds, int n, int ms) {
  pollfd p[8] = {{fd_, POLLIN, 0}};
  n = std::min(n, 7);
  for (int i = 0; i < n; ++i)
    p[i + 1] = {fds[i], POLLIN, 0};  // poll() skips negative descriptors
  ::poll(p, static_cast<nfds_t>(n + 1), ms);
  std::uint64_t v;
  if (p[0].revents & POLLIN && ::read(fd_, &v, sizeof v) < 0) {
  }
  unsigned ready = 0;
  for (int i = 0; i < n; ++i)
    if (fds[i] >= 0 && (p[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) ready |= 1u << i;
  return ready;
}

void watched_waiters::watch(const std::string& token, bool on) {
  std::lock_guard<std::mutex> l(mu_);
  if (on) {
    wanted_.insert(token);
    unconfirmed_.insert(token);
  } else {
    wanted_.erase(token);
    unconfirmed_.erase(token);
  }
}

bool watched_waiters::any() const {
  std::lock_guard<std::mutex> l(mu_);
  return !wanted_.empty();
}

std::optional<std::string> watched_waiters::only() const {
  std::lock_guard<std::mutex> l(mu_);
  if (wanted_.size() != 1) return std::nullopt;
  return *wanted_.begin();
}

void watched_waiters::confirm(const confirm_fn& confirmed) {
  std::set<std::string> now;
  {
    std::lock_guard<std::mutex> l(mu_);
    now.swap(unconfirmed_);
  }
  for (const auto& t : now)
    confirmed(t, true);
}

void watched_waiters::unconfirm_all(const confirm_fn& confirmed) {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& t : wanted_)
    confirmed(t, false);
  unconfirmed_ = wanted_;
}

std::string with_connect_timeout(const std::string& connect_string, long long seconds) {
  // The string is a list of key=value items as the connectors write them (values quoted by
  // conn_quote(): '...' with \ and ' escaped). Walk the items, so that text inside a quoted
  // value (a password holding " connect_timeout=") is never taken for a key.
  const std::string key = "connect_timeout";
  const std::string value = key + "=" + std::to_string(seconds);
  std::string out;
  bool replaced = false;
  std::size_t i = 0;
  const std::size_t n = connect_string.size();
  while (i < n) {
    if (connect_string[i] == ' ') {
      out += connect_string[i++];
      continue;
    }
    const std::size_t item = i;
    while (i < n && connect_string[i] != '=' && connect_string[i] != ' ')
      ++i;
    const bool ours = connect_string.compare(item, i - item, key) == 0;
    if (i < n && connect_string[i] == '=') {
      ++i;
      if (i < n && connect_string[i] == '\'') {
        for (++i; i < n && connect_string[i] != '\''; ++i)
          if (connect_string[i] == '\\' && i + 1 < n) ++i;
        if (i < n) ++i;
      } else {
        while (i < n && connect_string[i] != ' ')
          ++i;
      }
    }
    if (ours && !replaced) {
      out += value;
      replaced = true;
    } else {
      out.append(connect_string, item, i - item);
    }
  }
  return replaced ? out : connect_string + " " + value;
}

}  // namespace dblock::detail

namespace dblock::detail {

bool is_fence_refusal(const std::string& error_text) {
  return error_text.find("DL001") != std::string::npos ||
         error_text.find("is not the current grant") != std::string::npos;
}

}  // namespace dblock::detail
