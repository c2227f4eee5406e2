// PostgreSQL wake-ups: the release statement notifies the head of a freed lease's waiter
// queue in the release's own transaction (vocabulary::release_returning(), migration 0009), on
// the channel of the handle that holds that waiter: dblock_w_<bell>, the bell its queue entry
// carries. By default the handles of a host share one listener, the host relay (relay.cpp,
// database_options::share_listener), and a release rings a head of its own relay directory
// itself (doorbell::ring_handle()). This file has what both ways share, the target, and the
// listener of one handle (share_listener = false, or no usable relay directory): each database
// handle keeps one connection outside its pool that LISTENs on its own
// channel only, and only while the handle has waiters (and a second after the last one left):
// PostgreSQL signals every listening backend of the database at each NOTIFY, whatever its
// channel, so a handle that listened for its whole life would slow down the handoffs of every
// other process while it had nothing to wait for. Waiters are reachable once the LISTEN is in
// place (bell_channel::addressed(): they poll until then); the notifications go to the wake
// hub, which wakes the waiter the payload names. The connection reconnects when it breaks (a
// lost ring costs latency only).
#include <libpq-fe.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "backend.hpp"
#include "core/url.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::pg {
namespace {

/// database_options::share_listener: the target names the host relay (relay.cpp).
const std::string relay_mark = "relay\n";
/// How long the connection keeps listening after the handle's last waiter left.
constexpr auto linger = std::chrono::seconds(1);

class channel final : public listening_channel {
 public:
  channel(std::string conninfo, bell_callbacks cb)
      : listening_channel(std::move(conninfo), std::move(cb), "wake-up listener"),
        bell_(random_hex32()) {
    start();
  }
  ~channel() override { stop(); }
  std::string address() const override { return bell_; }

 private:
  /// Waits for the socket or a poke up to `ms` (-1: forever); true when the socket is readable.
  bool wait(int fd, int ms) { return poke_.wait(fd, ms); }
  /// Tells the hub that the waiters watched so far are reachable (the LISTEN is in place).
  void confirm() { watched_.confirm(cb_.confirmed); }
  void drain(PGconn* c) {
    while (PGnotify* n = PQnotifies(c)) {
      const std::string p = n->extra ? n->extra : "";
      PQfreemem(n);
      ring_event ev;
      std::string handle;
      if (parse_ring_payload(p, ev, handle)) cb_.deliver(ev);
    }
  }
  /// One connection's life: listens while the handle has waiters, until the connection breaks.
  void serve(PGconn* c) {
    using clock = std::chrono::steady_clock;
    auto idle_since = clock::now();
    bool listening = false;
    while (!stop_.load()) {
      const bool want = wanted();
      if (want) idle_since = clock::now();
      if (want && !listening) {
        if (!link_.command(c, "LISTEN " + bell_listen(bell_))) break;
        listening = true;
        live_.store(true);
      } else if (!want && listening && clock::now() - idle_since >= linger) {
        live_.store(false);
        if (!link_.command(c, "UNLISTEN *")) break;
        listening = false;
      }
      if (listening) confirm();
      int ms = -1;             // waiters, or not listening: until a poke (or a notification)
      if (!want && listening)  // until the linger ends
        ms = std::max(0, static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              idle_since + linger - clock::now())
                                              .count()) +
                             1);
      if (wait(PQsocket(c), ms)) {
        if (!PQconsumeInput(c)) {
          if (!stop_.load())
            log(std::string("connection lost, reconnecting: ") + PQerrorMessage(c));
          break;
        }
        drain(c);
      }
    }
    live_.store(false);
    watched_.unconfirm_all(cb_.confirmed);  // confirmed again once the next connection listens
  }
  void run() override {
    int backoff_ms = 10;
    while (!stop_.load()) {
      if (!wanted()) {
        wait(-1, -1);  // connect only once the handle has a waiter
        continue;
      }
      PGconn* c = link_.connect();
      if (!c) {
        wait(-1, backoff_ms);
        backoff_ms = std::min(backoff_ms * 2, 1000);
        continue;
      }
      backoff_ms = 10;
      serve(c);
      PQfinish(c);
      // Releases while nobody listened went unheard: every waiter looks again.
      if (!stop_.load()) cb_.lost();
    }
  }

  const std::string bell_;  // this handle's channel: dblock_w_<bell>
};

}  // namespace

std::string doorbell::target(const parsed_url& u, const database_options& o) const {
  static const connector conn;
  if (!o.listen_url.empty()) {
    const parsed_url l = parse_url(o.listen_url);
    if (l.scheme != "postgresql")
      throw error(
          errc::invalid_argument,
          "database_options::listen_url must be a postgresql:// URL, not '" + l.redacted + "'");
    database_options direct = o;
    direct.pooler = pooler_mode::none;
    url_connect_timeout(l, direct);  // the listen URL's own connect_timeout, checked
    return (o.share_listener ? relay_mark : "") + conn.connect_string(l, direct);
  }
  // LISTEN needs a server session of its own: not through a transaction-mode pooler.
  if (o.pooler == pooler_mode::transaction) return {};
  return (o.share_listener ? relay_mark : "") + conn.connect_string(u, o);
}

std::unique_ptr<bell_channel> doorbell::open(const std::string& target, const table_names&,
                                             bell_callbacks cb) const {
  if (target.rfind(relay_mark, 0) == 0) {
    const std::string conninfo = target.substr(relay_mark.size());
    if (auto r = open_relay(conninfo, cb)) return r;
    return std::make_unique<channel>(conninfo, std::move(cb));
  }
  return std::make_unique<channel>(target, std::move(cb));
}

namespace {
// The listener's conninfo of a target (with or without the relay).
std::string listen_conninfo(const std::string& target) {
  return target.rfind(relay_mark, 0) == 0 ? target.substr(relay_mark.size()) : target;
}
}  // namespace

std::string doorbell::relay_bell(const std::string& target) const {
  // Also for a handle that listens alone (share_listener = false): its releases can still ring
  // the relay's handles. None behind a transaction pooler without a listen_url.
  return target.empty() ? std::string() : relay_host_bell(listen_conninfo(target));
}

bool doorbell::ring_handle(const std::string& target, const std::string& name, std::int64_t fence,
                           std::int64_t handle, std::int64_t granted_ticket) const {
  return !target.empty() &&
         ring_relay_handle(listen_conninfo(target), name, fence, handle, granted_ticket);
}

listening_channel::listening_channel(std::string conninfo, bell_callbacks cb, std::string what)
    : what_(std::move(what)),
      cb_(std::move(cb)),
      link_{std::move(conninfo), [this](const std::string& m) { log(m); }} {}

void listening_channel::start() {
  thread_ = std::thread([this] { run(); });
}

void listening_channel::stop() {
  stop_.store(true);
  poke_.poke();
  if (thread_.joinable()) thread_.join();
}

void listening_channel::watch(const std::string& token, bool on) {
  watched_.watch(token, on);
  poke_.poke();
}

void listening_channel::log(const std::string& m) const {
  if (cb_.log) cb_.log(log_level::warning, what_ + ": " + m);
}

PGconn* listen_link::connect() const {
  PGconn* c = PQconnectdb(conninfo.c_str());
  // The library never prints (libpq's default writes notices, such as the server's "terminating
  // connection due to immediate shutdown", to stderr).
  if (c)
    PQsetNoticeProcessor(
        c, [](void*, const char*) {}, nullptr);
  if (PQstatus(c) == CONNECTION_OK) return c;
  log(std::string("cannot connect (waiters poll meanwhile): ") + PQerrorMessage(c));
  PQfinish(c);
  return nullptr;
}

bool listen_link::command(PGconn* c, const std::string& sql) const {
  try {
    pg::command(c, sql);
    return true;
  } catch (const std::exception& e) {
    log(sql + " failed (waiters poll meanwhile): " + e.what());
    return false;
  }
}

bool parse_ring_payload(const std::string& p, ring_event& ev, std::string& handle) {
  const auto a = p.find(':');
  const auto b = a == std::string::npos ? a : p.find(':', a + 1);
  if (b == std::string::npos) return false;
  ev.fence = std::atoll(p.substr(0, a).c_str());
  ev.head = p.substr(a + 1, b - a - 1);
  ev.name = p.substr(b + 1);
  const auto at = ev.head.find('@');
  handle = at == std::string::npos ? std::string() : ev.head.substr(at + 1);
  if (at != std::string::npos) ev.head.resize(at);
  return true;
}

std::string bell_listen(const std::string& bell) {
  return "\"dblock_w_" + bell + "\"";
}

}  // namespace dblock::detail::pg
