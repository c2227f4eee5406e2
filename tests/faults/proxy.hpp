// A loopback TCP proxy for fault-injection tests: forwards 127.0.0.1:port() to a real server and,
// on command, cuts connections (RST), cuts the next reply to a statement, or delays replies.
//
// Threads + poll, no dependencies. Patterns are matched on the raw client->server bytes, which
// contain the SQL text for both SOCI backends (PostgreSQL sends the query string, MariaDB's
// COM_QUERY carries it), so "COMMIT" or "INSERT INTO <lock table>" find the statement whose
// reply is to be cut or delayed.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dblock::test {

/**
 * @brief Forwards one local port to `host:port`; every member is thread-safe.
 *
 * One-shot commands (cut_after_bytes, cut_reply_to, delay_reply_to) apply to the first
 * connection that triggers them and then disarm themselves.
 */
class tcp_proxy {
 public:
  /// Listens on 127.0.0.1 on a free port and forwards to `host:port`.
  tcp_proxy(std::string host, int port);
  ~tcp_proxy();
  tcp_proxy(const tcp_proxy&) = delete;
  tcp_proxy& operator=(const tcp_proxy&) = delete;

  /// The local port clients connect to.
  int port() const { return port_; }

  /// Resets (RST) every open connection now.
  void cut_all();
  /// Resets the connection on which `n` more bytes (either direction) have been forwarded.
  void cut_after_bytes(long long n);
  /// The next connection whose client sends `pattern`: the server's reply to it is dropped and
  /// the connection reset (the statement ran; the client never learns the outcome).
  void cut_reply_to(const std::string& pattern);
  /// The next connection whose client sends `pattern` (in bytes sent after this call): the
  /// connection is reset at once, without waiting for a reply. `forward` false drops the bytes
  /// that completed the pattern (the server never gets the request); true forwards them first
  /// (the server may or may not act on the request before it sees the reset).
  void cut_request_to(const std::string& pattern, bool forward);
  /// The next connection whose client sends `pattern`: the server's reply is held back `d`.
  void delay_reply_to(const std::string& pattern, std::chrono::milliseconds d);
  /// Delays every server->client byte by `d` (zero: off).
  void delay_all_replies(std::chrono::milliseconds d);
  /// While on, nothing is forwarded either way (connections hang) and new ones are accepted
  /// but never connected upstream.
  void set_blackhole(bool on);
  /// While on, new connections are reset at once.
  void set_refuse(bool on);
  /// Local ports of the proxy's open upstream sockets (the server sees these as client ports).
  std::vector<int> upstream_ports() const;
  /// Connections reset by a command so far.
  long long cuts() const { return cuts_.load(); }

 private:
  struct conn;
  void accept_loop();
  void serve(const std::shared_ptr<conn>& c);

  std::string host_;
  int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<long long> cut_generation_{0};
  std::atomic<long long> cuts_{0};
  std::atomic<bool> blackhole_{false};
  std::atomic<bool> refuse_{false};
  std::atomic<long long> delay_all_ns_{0};

  mutable std::mutex mu_;
  long long cut_budget_ = -1;  // bytes left before the one-shot cut, -1: off
  std::string cut_pattern_;
  std::string cut_request_pattern_;
  bool cut_request_forward_ = false;
  std::string delay_pattern_;
  long long delay_ns_ = 0;
  std::vector<std::shared_ptr<conn>> conns_;
  std::vector<std::thread> threads_;
  std::thread acceptor_;
};

/// `url` with its host and port replaced by 127.0.0.1:`port` (PostgreSQL and MySQL URLs).
std::string url_via(const std::string& url, int port);

/// Host and port of a PostgreSQL or MySQL URL.
std::pair<std::string, int> url_host_port(const std::string& url);

}  // namespace dblock::test
