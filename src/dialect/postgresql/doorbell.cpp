// PostgreSQL wake-ups: the lock table's trigger (migrations 0004, 0005) notifies the head of a
// freed lease's waiter queue in the release's own transaction, on the channel of the handle that
// holds that waiter: dblock_w_<bell>, the bell its queue entry carries. Each database handle
// keeps one connection outside its pool that LISTENs on its own channel only (once, when it
// connects: no subscription per waiter), delivers the notifications to the wake hub, which wakes
// the waiter the payload names, and reconnects when the connection breaks (a lost ring costs
// latency only).
#include <libpq-fe.h>

#include <atomic>
#include <thread>
#include <utility>

#include "../common.hpp"
#include "backend.hpp"
#include "url.hpp"

namespace dblock::detail::pg {
namespace {

const std::string channel_prefix = "dblock_w_";

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
  std::string address() const override { return bell_; }

 private:
  void log(const std::string& m) {
    if (cb_.log) cb_.log(log_level::warning, "wake-up listener: " + m);
  }
  /// Waits for the socket or a poke up to `ms` (-1: forever); false when stopping.
  bool wait(int fd, int ms) {
    poke_.wait(fd, ms);
    return !stop_.load();
  }
  PGconn* connect() {
    PGconn* c = PQconnectdb(conninfo_.c_str());
    if (PQstatus(c) == CONNECTION_OK) return c;
    log(std::string("cannot connect (waiters poll meanwhile): ") + PQerrorMessage(c));
    PQfinish(c);
    return nullptr;
  }
  bool listen(PGconn* c) {
    const std::string sql = "LISTEN \"" + channel_prefix + bell_ + "\"";
    PGresult* r = PQexec(c, sql.c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (!ok) log(std::string("LISTEN failed (waiters poll meanwhile): ") + PQerrorMessage(c));
    return ok;
  }
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
  /// One connection's life: listen on this handle's channel, then serve until it breaks.
  void serve(PGconn* c) {
    if (!listen(c)) return;
    live_.store(true);
    cb_.lost();  // releases while we were not listening went unheard: every waiter looks again
    while (wait(PQsocket(c), -1)) {
      if (!PQconsumeInput(c)) {
        log(std::string("connection lost, reconnecting: ") + PQerrorMessage(c));
        break;
      }
      drain(c);
    }
    live_.store(false);
  }
  void run() {
    int backoff_ms = 10;
    while (!stop_.load()) {
      PGconn* c = connect();
      if (!c) {
        if (!wait(-1, backoff_ms)) return;
        backoff_ms = std::min(backoff_ms * 2, 1000);
        continue;
      }
      backoff_ms = 10;
      serve(c);
      PQfinish(c);
      if (!stop_.load() && !wait(-1, backoff_ms)) return;
    }
  }

  const std::string conninfo_;
  bell_callbacks cb_;
  const std::string bell_;  // this handle's channel: dblock_w_<bell>
  poke_fd poke_;
  std::atomic<bool> stop_{false}, live_{false};
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
