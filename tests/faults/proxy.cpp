#include "proxy.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <stdexcept>

namespace dblock::test {
namespace {

long long now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

// Closes with SO_LINGER 0, which sends RST instead of FIN.
void reset_close(int fd) {
  if (fd < 0) return;
  linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pf{fd, POLLOUT, 0};
        ::poll(&pf, 1, 100);
        continue;
      }
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

int connect_to(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int local_port(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

}  // namespace

struct tcp_proxy::conn {
  int client = -1;
  int server = -1;
  int server_port = 0;
  long long generation = 0;
  std::atomic<bool> done{false};
};

tcp_proxy::tcp_proxy(std::string host, int port) : host_(std::move(host)), upstream_port_(port) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) throw std::runtime_error("proxy: socket failed");
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 128) != 0) {
    ::close(listen_fd_);
    throw std::runtime_error(std::string("proxy: bind/listen failed: ") + std::strerror(errno));
  }
  port_ = local_port(listen_fd_);
  acceptor_ = std::thread([this] { accept_loop(); });
}

tcp_proxy::~tcp_proxy() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> ts;
  {
    std::lock_guard<std::mutex> g(mu_);
    ts.swap(threads_);
  }
  for (auto& t : ts)
    t.join();
  ::close(listen_fd_);
}

void tcp_proxy::accept_loop() {
  while (!stop_) {
    pollfd pf{listen_fd_, POLLIN, 0};
    if (::poll(&pf, 1, 20) <= 0) continue;
    int c = ::accept(listen_fd_, nullptr, nullptr);
    if (c < 0) continue;
    if (refuse_) {
      reset_close(c);
      continue;
    }
    int one = 1;
    ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto k = std::make_shared<conn>();
    k->client = c;
    k->generation = cut_generation_.load();
    std::lock_guard<std::mutex> g(mu_);
    // Forget finished connections so the lists stay short in long runs.
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::shared_ptr<conn>& x) { return x->done.load(); }),
                 conns_.end());
    conns_.push_back(k);
    threads_.emplace_back([this, k] { serve(k); });
  }
}

void tcp_proxy::serve(const std::shared_ptr<conn>& c) {
  // A blackholed connection is accepted but not connected until the blackhole ends.
  while (blackhole_ && !stop_ && c->generation == cut_generation_.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (!stop_ && c->generation == cut_generation_.load())
    c->server = connect_to(host_, upstream_port_);
  if (c->server < 0) {
    reset_close(c->client);
    c->done = true;
    return;
  }
  c->server_port = local_port(c->server);
  struct chunk {
    long long due_ns;
    std::string bytes;
  };
  std::deque<chunk> pending;  // server->client bytes waiting for their delivery time
  std::string tail;           // last client bytes, for patterns split across reads
  bool cut_on_reply = false;
  long long hold_ns = 0;  // armed one-shot delay for the next reply, 0: none
  long long hold_until = 0;
  char buf[65536];
  auto cut = [&] {
    cuts_.fetch_add(1);  // counted first: the client may see the reset at once
    reset_close(c->client);
    reset_close(c->server);
    c->client = c->server = -1;
  };
  // Returns true when the one-shot byte budget ran out on this connection.
  auto spend = [&](long long n) {
    std::lock_guard<std::mutex> g(mu_);
    if (cut_budget_ < 0) return false;
    cut_budget_ -= n;
    if (cut_budget_ > 0) return false;
    cut_budget_ = -1;
    return true;
  };
  while (!stop_) {
    if (c->generation != cut_generation_.load()) {
      cut();
      break;
    }
    const long long now = now_ns();
    while (!pending.empty() && pending.front().due_ns <= now) {
      if (!write_all(c->client, pending.front().bytes.data(), pending.front().bytes.size())) break;
      pending.pop_front();
    }
    int timeout_ms = 5;
    if (!pending.empty())
      timeout_ms =
          static_cast<int>(std::clamp<long long>((pending.front().due_ns - now) / 1000000LL, 0, 5));
    if (blackhole_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    pollfd pf[2] = {{c->client, POLLIN, 0}, {c->server, POLLIN, 0}};
    int r = ::poll(pf, 2, timeout_ms);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    bool closed = false;
    if (pf[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = ::recv(c->client, buf, sizeof buf, 0);
      if (n <= 0) {
        closed = true;
      } else {
        const std::size_t old_tail = tail.size();
        tail.append(buf, static_cast<std::size_t>(n));
        bool cut_request = false, forward_request = false;
        {
          std::lock_guard<std::mutex> g(mu_);
          // Only a match that ends in the new bytes counts: the request must be sent now.
          const std::size_t k = cut_request_pattern_.size();
          if (k > 0 && tail.find(cut_request_pattern_, old_tail + 1 > k ? old_tail + 1 - k : 0) !=
                           std::string::npos) {
            cut_request_pattern_.clear();
            cut_request = true;
            forward_request = cut_request_forward_;
          }
          if (!cut_pattern_.empty() && tail.find(cut_pattern_) != std::string::npos) {
            cut_pattern_.clear();
            cut_on_reply = true;
          }
          if (!delay_pattern_.empty() && tail.find(delay_pattern_) != std::string::npos) {
            delay_pattern_.clear();
            hold_ns = delay_ns_;
            hold_until = 0;
          }
        }
        if (tail.size() > 512) tail.erase(0, tail.size() - 512);
        if (cut_request) {
          if (forward_request) write_all(c->server, buf, static_cast<std::size_t>(n));
          cut();
          break;
        }
        if (spend(n)) {
          cut();
          break;
        }
        if (!write_all(c->server, buf, static_cast<std::size_t>(n))) closed = true;
      }
    }
    if (!closed && (pf[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = ::recv(c->server, buf, sizeof buf, 0);
      if (n <= 0) {
        closed = true;
      } else if (cut_on_reply) {
        cut();
        break;
      } else {
        if (spend(n)) {
          cut();
          break;
        }
        long long t = now_ns();
        long long due = t + delay_all_ns_.load();
        if (hold_ns > 0) {
          if (hold_until == 0) hold_until = t + hold_ns;
          due = std::max(due, hold_until);
        }
        if (!pending.empty()) due = std::max(due, pending.back().due_ns);
        pending.push_back({due, std::string(buf, static_cast<std::size_t>(n))});
      }
    }
    if (closed) {
      // Deliver what is due anyway, then close both sides (FIN) like the peer did.
      for (auto& p : pending)
        write_all(c->client, p.bytes.data(), p.bytes.size());
      break;
    }
  }
  if (c->client >= 0) ::close(c->client);
  if (c->server >= 0) ::close(c->server);
  c->client = c->server = -1;
  c->done = true;
}

void tcp_proxy::cut_all() {
  cut_generation_.fetch_add(1);
}

void tcp_proxy::cut_after_bytes(long long n) {
  std::lock_guard<std::mutex> g(mu_);
  cut_budget_ = std::max(1LL, n);
}

void tcp_proxy::cut_reply_to(const std::string& pattern) {
  std::lock_guard<std::mutex> g(mu_);
  cut_pattern_ = pattern;
}

void tcp_proxy::cut_request_to(const std::string& pattern, bool forward) {
  std::lock_guard<std::mutex> g(mu_);
  cut_request_pattern_ = pattern;
  cut_request_forward_ = forward;
}

void tcp_proxy::delay_reply_to(const std::string& pattern, std::chrono::milliseconds d) {
  std::lock_guard<std::mutex> g(mu_);
  delay_pattern_ = pattern;
  delay_ns_ = std::chrono::nanoseconds(d).count();
}

void tcp_proxy::delay_all_replies(std::chrono::milliseconds d) {
  delay_all_ns_ = std::chrono::nanoseconds(d).count();
}

void tcp_proxy::set_blackhole(bool on) {
  blackhole_ = on;
}

void tcp_proxy::set_refuse(bool on) {
  refuse_ = on;
}

std::vector<int> tcp_proxy::upstream_ports() const {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<int> out;
  for (const auto& c : conns_)
    if (!c->done && c->server_port > 0) out.push_back(c->server_port);
  return out;
}

std::pair<std::string, int> url_host_port(const std::string& url) {
  auto scheme_end = url.find("://");
  auto start = url.find('@', scheme_end);
  start = start == std::string::npos ? scheme_end + 3 : start + 1;
  auto end = url.find_first_of("/?", start);
  std::string hp = url.substr(start, end == std::string::npos ? std::string::npos : end - start);
  auto colon = hp.rfind(':');
  if (colon == std::string::npos) return {hp, 0};
  return {hp.substr(0, colon), std::stoi(hp.substr(colon + 1))};
}

std::string url_via(const std::string& url, int port) {
  auto scheme_end = url.find("://");
  auto start = url.find('@', scheme_end);
  start = start == std::string::npos ? scheme_end + 3 : start + 1;
  auto end = url.find_first_of("/?", start);
  return url.substr(0, start) + "127.0.0.1:" + std::to_string(port) +
         (end == std::string::npos ? "" : url.substr(end));
}

}  // namespace dblock::test
