// PostgreSQL wake-ups: the release statement notifies the head of a freed lease's waiter
// queue in the release's own transaction (vocabulary::release_returning(), migration 0009), on
// the channel of the handle that holds that waiter: dblock_w_<bell>, the bell its queue entry
// carries. Each database handle keeps one connection outside its pool that LISTENs on its own
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

#include "../common.hpp"
#include "backend.hpp"
#include "url.hpp"

namespace dblock::detail::pg {
namespace {

const std::string channel_prefix = "dblock_w_";
/// How long the connection keeps listening after the handle's last waiter left.
constexpr auto linger = std::chrono::seconds(1);

class channel final : public bell_channel {
 public:
  channel(std::string conninfo, bell_callbacks cb)
      : conninfo_(std::move(conninfo)), cb_(std::move(cb)), bell_(random_hex32()) {
    thread_ = std::thread([this] { run(); });
  }
  ~channel() override {
    stop_.store(true);
    poke_.poke();
    thread_.join();
  }
  bool live() const override { return live_.load(); }
  bool addressed() const override { return true; }
  // The release looks up the head of the queue as of its statement's start: a release that
  // began before a new waiter's entry was committed, and commits after that waiter's first
  // read, rings nobody for it. It commits within milliseconds; one more read then finds it.
  std::chrono::milliseconds joined_recheck() const override {
    return std::chrono::milliseconds(10);
  }
  std::string address() const override { return bell_; }
  void watch(const std::string& token, bool on) override {
    watched_.watch(token, on);
    poke_.poke();
  }

 private:
  void log(const std::string& m) {
    if (cb_.log) cb_.log(log_level::warning, "wake-up listener: " + m);
  }
  /// Waits for the socket or a poke up to `ms` (-1: forever); true when the socket is readable.
  bool wait(int fd, int ms) { return poke_.wait(fd, ms); }
  bool wanted() const { return watched_.any(); }
  PGconn* connect() {
    PGconn* c = PQconnectdb(conninfo_.c_str());
    if (PQstatus(c) == CONNECTION_OK) return c;
    log(std::string("cannot connect (waiters poll meanwhile): ") + PQerrorMessage(c));
    PQfinish(c);
    return nullptr;
  }
  /// pg::command(), failures logged instead of thrown (the caller reconnects).
  bool command(PGconn* c, const std::string& sql) {
    try {
      pg::command(c, sql);
      return true;
    } catch (const std::exception& e) {
      log(sql + " failed (waiters poll meanwhile): " + e.what());
      return false;
    }
  }
  /// Tells the hub that the waiters watched so far are reachable (the LISTEN is in place).
  void confirm() { watched_.confirm(cb_.confirmed); }
  void drain(PGconn* c) {
    while (PGnotify* n = PQnotifies(c)) {
      // "<fence>:<head token>:<name>"; the name may itself contain ':'.
      const std::string p = n->extra ? n->extra : "";
      PQfreemem(n);
      const auto a = p.find(':');
      const auto b = a == std::string::npos ? a : p.find(':', a + 1);
      if (b == std::string::npos) continue;
      ring_event ev;
      ev.fence = std::atoll(p.substr(0, a).c_str());
      ev.head = p.substr(a + 1, b - a - 1);
      ev.name = p.substr(b + 1);
      cb_.deliver(ev);
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
        if (!command(c, "LISTEN \"" + channel_prefix + bell_ + "\"")) break;
        listening = true;
        live_.store(true);
      } else if (!want && listening && clock::now() - idle_since >= linger) {
        live_.store(false);
        if (!command(c, "UNLISTEN *")) break;
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
  void run() {
    int backoff_ms = 10;
    while (!stop_.load()) {
      if (!wanted()) {
        wait(-1, -1);  // connect only once the handle has a waiter
        continue;
      }
      PGconn* c = connect();
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

  const std::string conninfo_;
  bell_callbacks cb_;
  const std::string bell_;  // this handle's channel: dblock_w_<bell>
  poke_fd poke_;
  std::atomic<bool> stop_{false}, live_{false};
  watched_waiters watched_;  // this handle's waiters
  std::thread thread_;
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
    return conn.connect_string(l, direct);
  }
  // LISTEN needs a server session of its own: not through a transaction-mode pooler.
  if (o.pooler == pooler_mode::transaction) return {};
  return conn.connect_string(u, o);
}

std::unique_ptr<bell_channel> doorbell::open(const std::string& target, const table_names&,
                                             bell_callbacks cb) const {
  return std::make_unique<channel>(target, std::move(cb));
}

}  // namespace dblock::detail::pg
