// PostgreSQL wake-ups: the lock table's trigger (migration 0004) notifies the head of a freed
// lease's waiter queue in the release's own transaction, on a channel named after that waiter's
// owner token. Each database handle keeps one listening connection outside its pool, on a
// thread that subscribes to the channels of the handle's waiters (LISTEN / UNLISTEN, batched
// and asynchronous), delivers their notifications to the wake hub and reconnects when the
// connection breaks (a lost ring costs latency only).
#include <libpq-fe.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "../common.hpp"
#include "backend.hpp"
#include "url.hpp"

namespace dblock::detail::pg {
namespace {

const std::string channel_prefix = "dblock_w_";

class channel final : public bell_channel {
 public:
  channel(std::string conninfo, bell_callbacks cb)
      : conninfo_(std::move(conninfo)), cb_(std::move(cb)) {
    thread_ = std::thread([this] { run(); });
  }
  ~channel() override {
    stop_.store(true);
    poke();
    thread_.join();
  }
  bool live() const override { return live_.load(); }
  bool addressed() const override { return true; }
  void watch(const std::string& token, bool on) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (on)
        wanted_.insert(token);
      else
        wanted_.erase(token);
      pending_.emplace_back(token, on);
    }
    poke();
  }

 private:
  using change = std::pair<std::string, bool>;

  void poke() { poke_.poke(); }
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
  /// Sends the pending subscription changes as one query; false when the connection broke.
  bool send(PGconn* c) {
    {
      std::lock_guard<std::mutex> l(mu_);
      inflight_.swap(pending_);
      pending_.clear();
    }
    if (inflight_.empty()) return true;
    std::string sql;
    for (const auto& ch : inflight_)
      sql +=
          std::string(ch.second ? "LISTEN \"" : "UNLISTEN \"") + channel_prefix + ch.first + "\";";
    busy_ = true;
    return PQsendQuery(c, sql.c_str()) == 1;
  }
  /// Reads the results of the query in flight; false when it failed.
  bool collect(PGconn* c) {
    while (busy_ && !PQisBusy(c)) {
      PGresult* r = PQgetResult(c);
      if (!r) {
        busy_ = false;
        for (const auto& ch : inflight_)
          if (ch.second) cb_.confirmed(ch.first, true);
        inflight_.clear();
        return true;
      }
      const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
      PQclear(r);
      if (!ok) return false;
    }
    return true;
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
  /// One connection's life: subscribe every wanted channel, then serve until it breaks.
  void serve(PGconn* c) {
    {
      std::lock_guard<std::mutex> l(mu_);
      pending_.clear();
      for (const auto& t : wanted_)
        pending_.emplace_back(t, true);
    }
    live_.store(true);
    bool resubscribed = false;
    while (wait(PQsocket(c), -1)) {
      if (!PQconsumeInput(c) || !collect(c) || (!busy_ && !send(c))) {
        log(std::string("connection lost, reconnecting: ") + PQerrorMessage(c));
        break;
      }
      if (!busy_ && !resubscribed) {
        resubscribed = true;
        cb_.lost();  // releases while we were not listening went unheard
      }
      drain(c);
    }
    live_.store(false);
    busy_ = false;
    inflight_.clear();
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& t : wanted_)
      cb_.confirmed(t, false);
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
      poke();  // the first round sends the subscriptions
      serve(c);
      PQfinish(c);
      if (!stop_.load()) cb_.lost();
    }
  }

  const std::string conninfo_;
  bell_callbacks cb_;
  poke_fd poke_;
  std::atomic<bool> stop_{false}, live_{false};
  std::mutex mu_;
  std::set<std::string> wanted_;  // tokens of this handle's waiters
  std::vector<change> pending_;   // changes not yet sent
  std::vector<change> inflight_;  // changes of the query in flight (listener thread only)
  bool busy_ = false;             // listener thread only
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
