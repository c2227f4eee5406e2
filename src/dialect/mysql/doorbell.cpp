// MySQL/MariaDB wake-ups (migration 0005). MySQL has no NOTIFY, so a release rings a connection:
// each database handle with waiters keeps one connection outside its pool, which holds the
// user-level lock "dblock-bell-<mark>" for its life and sleeps in
// "SELECT SLEEP(2) /* dblock-bell <mark> */"; its waiters' queue entries carry the mark.
// The release statement returns the session id holding the lock of the mark of the head of the
// freed lease's queue (IS_USED_LOCK); the releasing process then interrupts it (KILL QUERY;
// storage/wait_queue ring()). The interrupted sleeper reads which of its handle's
// waiters now head their queue and delivers one ring to each; then it sleeps again, unless a
// lease whose queue it heads is free already (a ring that came between two sleeps). A sleep is
// only in flight while the handle has waiters and lasts at most 2 s, so a closed handle leaves
// no long sleep behind on the server. A lost ring costs latency only (waiters still poll,
// bounded by the holder's expiry).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backend.hpp"
#include "core/url.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::my {
namespace {

constexpr unsigned er_query_interrupted = 1317;
/// How long a reconnected wake-up connection waits for its bell's lock before it ends the
/// session that keeps it (a killed session frees it within milliseconds).
constexpr auto stale_bell_after = std::chrono::seconds(5);
constexpr char field_sep = '\x1f';

/// One server of the URL, as the sleeping connection connects to it.
struct endpoint {
  std::string host, user, password, db, unix_socket, sslca, sslcert, sslkey;
  unsigned port = 0, timeout_s = 5;
};

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == sep)
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

std::vector<endpoint> parse_target(const std::string& target) {
  std::vector<endpoint> out;
  for (const auto& line : split(target, '\n')) {
    const auto f = split(line, field_sep);
    if (f.size() != 10) continue;
    endpoint e{f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]};
    e.port = static_cast<unsigned>(std::stoul(f[8]));
    e.timeout_s = static_cast<unsigned>(std::stoul(f[9]));
    out.push_back(std::move(e));
  }
  return out;
}

class channel final : public bell_channel {
 public:
  channel(std::vector<endpoint> eps, std::string waiters, std::string locks, bell_callbacks cb)
      : eps_(std::move(eps)),
        waiters_(std::move(waiters)),
        locks_(std::move(locks)),
        cb_(std::move(cb)),
        mark_(random_hex32()),
        heads_(heads_of(waiters_, locks_, mark_)),
        free_(free_of(locks_)),
        sleep_(sleep_sql(waiters_, locks_, mark_)),
        plain_sleep_(bell_sleep_prefix + mark_ + bell_sleep_suffix) {
    thread_ = std::thread([this] { run(); });
  }
  ~channel() override {
    stop_.store(true);
    poke();
    thread_.join();
  }
  bool live() const override { return live_.load(); }
  bool addressed() const override { return true; }
  std::string address() const override { return mark_; }
  bool is_self(std::int64_t id) const override { return id > 0 && id == session_.load(); }
  void watch(const std::string& token, bool on) override {
    watched_.watch(token, on);
    poke();
  }

 private:
  void poke() { poke_.poke(); }
  void log(const std::string& m) {
    if (cb_.log) cb_.log(log_level::warning, "wake-up sleeper: " + m);
  }
  /// Waits for the socket or a poke up to `ms` (-1: forever); true when the socket is readable.
  bool wait(int fd, int ms) { return poke_.wait(fd, ms); }
  MYSQL* connect_one(const endpoint& e) {
    MYSQL* m = mysql_init(nullptr);
    if (!m) return nullptr;
    unsigned t = e.timeout_s, io = 10;
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &t);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &io);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &io);
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    auto opt = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
    if (!e.sslca.empty() || !e.sslcert.empty() || !e.sslkey.empty())
      mysql_ssl_set(m, opt(e.sslkey), opt(e.sslcert), opt(e.sslca), nullptr, nullptr);
    if (mysql_real_connect(m, opt(e.host), e.user.c_str(), opt(e.password), e.db.c_str(), e.port,
                           opt(e.unix_socket), 0))
      return m;
    log(std::string("cannot connect (waiters poll meanwhile): ") + mysql_error(m));
    mysql_close(m);
    return nullptr;
  }
  MYSQL* connect() {
    for (const auto& e : eps_)
      if (MYSQL* m = connect_one(e)) return m;
    return nullptr;
  }
  /// Runs `sql` and returns its rows as (column 0, column 1); false when it failed.
  static bool query(MYSQL* m, const std::string& sql,
                    std::vector<std::pair<std::string, std::string>>& rows) {
    if (mysql_real_query(m, sql.c_str(), sql.size()) != 0) return false;
    MYSQL_RES* res = mysql_store_result(m);
    if (!res) return mysql_field_count(m) == 0;
    while (MYSQL_ROW row = mysql_fetch_row(res)) {
      const unsigned long* len = mysql_fetch_lengths(res);
      const unsigned n = mysql_num_fields(res);
      rows.emplace_back(row[0] ? std::string(row[0], len[0]) : std::string(),
                        n > 1 && row[1] ? std::string(row[1], len[1]) : std::string());
    }
    mysql_free_result(res);
    return true;
  }
  /// On Galera, a release rings only sleepers on the node it ran on (KILL QUERY is per node):
  /// true there, and then this connection is never live (the handle's waiters poll). Also true
  /// when the check fails.
  bool on_galera(MYSQL* m) {
    std::vector<std::pair<std::string, std::string>> rows;
    // SHOW answers on MariaDB and MySQL 8 alike (MySQL 8 has no information_schema table of
    // the global variables); no row: the server has no wsrep_on, it is no Galera node.
    return !query(m, "SHOW GLOBAL VARIABLES LIKE 'wsrep\\_on'", rows) ||
           (!rows.empty() && rows[0].second == "ON");
  }
  /// Ends the session that holds the bell's lock, when that is not this connection: an
  /// earlier connection of this channel (its marks are random and its own) whose network died
  /// while its server session lived on, which the server ends only at its wait_timeout.
  void end_bell_holder(MYSQL* m) {
    std::vector<std::pair<std::string, std::string>> rows;
    if (!query(m, "SELECT IS_USED_LOCK('" + bell_lock() + "')", rows) || rows.empty() ||
        rows[0].first.empty() || rows[0].first == std::to_string(mysql_thread_id(m)))
      return;
    const std::string kill = "KILL CONNECTION " + rows[0].first;
    if (mysql_real_query(m, kill.c_str(), kill.size()) == 0)
      log("ended session " + rows[0].first + ", which kept the bell's lock");
    else
      log("cannot end session " + rows[0].first +
          ", which keeps the bell's lock: " + mysql_error(m));
  }
  std::string bell_lock() const { return bell_lock_prefix + mark_; }
  enum class bell_lock_state { taken, busy, failed };
  /// Takes the bell's user-level lock, by which releases find this connection. `busy` right
  /// after a reconnect: the server frees a killed connection's locks as that session ends, a
  /// moment after the kill, so the lock can still be the lost connection's.
  bell_lock_state take_bell_lock(MYSQL* m) {
    std::vector<std::pair<std::string, std::string>> rows;
    if (!query(m, "SELECT GET_LOCK('" + bell_lock() + "', 0)", rows) || rows.empty())
      return bell_lock_state::failed;
    return rows[0].first == "1" ? bell_lock_state::taken : bell_lock_state::busy;
  }
  /// Rung: delivers one ring to each waiter of this handle that heads its queue.
  /// `free_only`: only the heads of leases that are free (a sleep that found one at its start:
  /// nothing was interrupted, and waiters on leases still held need no ring).
  bool ring(MYSQL* m, bool free_only = false) {
    // One waiter in this handle: the ring is for it, no read here. The interrupt carries
    // nothing, and one sent for an earlier waiter of this handle can land late, on this one
    // (the releaser is descheduled between its release and the KILL QUERY, while the earlier
    // waiter took the lease by polling and this one queued anew): a fair waiter's acquire
    // statement checks the queue order itself, so such a ring costs a refused try only.
    if (auto only = free_only ? std::nullopt : watched_.only()) {
      ring_event ev;
      ev.head = *only;
      cb_.deliver(ev);
      return true;
    }
    const std::string sql =
        "SELECT w.resource_name, w.owner_token" + heads_ + (free_only ? free_ : std::string());
    std::vector<std::pair<std::string, std::string>> rows;
    // A KILL QUERY that arrived just after a sleep ended can interrupt this read: once more.
    if (!query(m, sql, rows) && (mysql_errno(m) != er_query_interrupted || !query(m, sql, rows)))
      return false;
    for (const auto& r : rows) {
      ring_event ev;
      ev.name = r.first;
      ev.head = r.second;
      cb_.deliver(ev);
    }
    return true;
  }
  /// Tells the hub that the waiters watched so far are reachable (a sleep is in flight).
  void confirm() { watched_.confirm(cb_.confirmed); }
  bool wanted() const { return watched_.any(); }
  /// " FROM ... WHERE ...": this handle's waiters that head their queue (oldest live entry).
  /// Entries of the lease's holder are not waiting (a new holder's entry is deleted during its
  /// hold, wait_queue::deferred_exit), as in every other read of the queue.
  static std::string heads_of(const std::string& waiters, const std::string& locks,
                              const std::string& mark) {
    const std::string now = "UTC_TIMESTAMP(6)";
    auto waiting = [&](const std::string& e) {
      return e + ".expires_at > " + now + " AND NOT EXISTS (SELECT 1 FROM " + locks +
             " l WHERE l.resource_name = " + e + ".resource_name AND l.owner_token = " + e +
             ".owner_token)";
    };
    return " FROM " + waiters + " w WHERE w.bell = '" + mark + "' AND " + waiting("w") + " AND (" +
           broadcast("w") + " OR NOT EXISTS (SELECT 1 FROM " + waiters +
           " h WHERE h.resource_name = w.resource_name AND h.ticket < w.ticket AND " +
           waiting("h") + "))";
  }
  /// True for an entry `e` of a broadcast queue (broadcast_suffix): every one of those is rung,
  /// so each counts as a head here (an interrupt for another waiter of this handle wakes it
  /// too, for one read), but none waits for a lease to be free.
  static std::string broadcast(const std::string& e) { return ends_with(e, broadcast_suffix); }
  /// True for an entry `e` of a queue-only name (queue_suffix): no lease row has its name.
  static std::string queue_only(const std::string& e) { return ends_with(e, queue_suffix); }
  static std::string ends_with(const std::string& e, std::string_view suffix) {
    std::string hex;
    for (unsigned char c : suffix) {
      static const char digits[] = "0123456789ABCDEF";
      hex += digits[c >> 4];
      hex += digits[c & 15];
    }
    return "RIGHT(" + e + ".resource_name, " + std::to_string(suffix.size()) + ") = X'" + hex + "'";
  }
  /// The sleep, unless a lease whose queue this handle's waiter heads is free already: a
  /// release whose KILL QUERY came while this connection was between sleeps (reading heads,
  /// or just woken from the last sleep) interrupted nothing, and its ring would be lost. Then
  /// the statement returns no row and the heads are rung as after an interrupt.
  static std::string sleep_sql(const std::string& waiters, const std::string& locks,
                               const std::string& mark) {
    return bell_sleep_prefix + mark + bell_sleep_suffix + " FROM DUAL WHERE NOT EXISTS (SELECT 1" +
           heads_of(waiters, locks, mark) + free_of(locks) + ")";
  }
  /// " AND ...": the lease of head entry w is free (no row held and unexpired); never for a
  /// broadcast entry or a queue-only name, which have no lease (the sleep would end at once,
  /// again and again).
  static std::string free_of(const std::string& locks) {
    return " AND NOT " + broadcast("w") + " AND NOT " + queue_only("w") +
           " AND NOT EXISTS (SELECT 1 FROM " + locks +
           " f WHERE f.resource_name = w.resource_name AND f.hold_count > 0 AND f.expires_at > "
           "UTC_TIMESTAMP(6))";
  }
  /// One sleep: true when it ended normally or by a ring, false when the connection broke.
  bool sleep_once(MYSQL* m) {
    // A free lease that a waiter here heads, found at the statement's start, ends it at once
    // (below), and only the heads of free leases are rung. Such a lease may stay free for a
    // moment while the waiter rung for it gets to its try: the quick rounds back off (2 ms
    // doubling to 256 ms), and after 20 of them one plain sleep follows, so an entry that
    // cannot take it (a waiter gone without deleting it: it expires at its TTL) makes this
    // connection neither spin nor hammer the server.
    const bool check = quick_rounds_ < 20;
    if (quick_rounds_ > 0) wait(-1, 2 << std::min(quick_rounds_ - 1, 7));  // 2 .. 256 ms
    const std::string& q = check ? sleep_ : plain_sleep_;
    if (mysql_send_query(m, q.c_str(), q.size()) != 0) return false;
    confirm();
    while (!wait(static_cast<int>(mysql_get_socket(m)), -1)) {
      if (stop_.load()) return false;
      confirm();  // waiters that arrived during the sleep are reachable at once
    }
    // Interrupted: an error instead of the result, or in the middle of it (MariaDB sends the
    // column and then the error), or SLEEP's own 1 where the server returns that.
    if (mysql_read_query_result(m) != 0) {
      quick_rounds_ = 0;
      return mysql_errno(m) == er_query_interrupted && ring(m);
    }
    MYSQL_RES* res = mysql_store_result(m);
    if (!res) {
      quick_rounds_ = 0;
      return mysql_errno(m) == er_query_interrupted && ring(m);
    }
    MYSQL_ROW row = mysql_fetch_row(res);
    const bool pending = !row;  // no row: a free lease waits for a waiter here (no sleep)
    const bool interrupted = row && row[0] && std::string(row[0]) == "1";
    mysql_free_result(res);
    quick_rounds_ = pending ? quick_rounds_ + 1 : 0;
    if (pending) return ring(m, true);
    return !interrupted || ring(m);
  }
  /// One connection's life: sleep while the handle has waiters, until the connection breaks.
  /// While the bell's lock is busy, no sleep: it is tried again with a growing pause (the
  /// handle's waiters poll meanwhile), so the channel is live again once the lock is free. A
  /// lock still busy after stale_bell_after is taken from the session that keeps it.
  void serve(MYSQL* m) {
    session_.store(static_cast<std::int64_t>(mysql_thread_id(m)));
    bool try_lock = !on_galera(m);
    int pause_ms = 10;
    auto end_holder_at = std::chrono::steady_clock::time_point::max();  // max: not busy yet
    while (!stop_.load()) {
      if (!wanted()) {
        wait(-1, -1);
        continue;
      }
      if (try_lock) {
        const bell_lock_state b = take_bell_lock(m);
        if (b == bell_lock_state::busy) {
          const auto now = std::chrono::steady_clock::now();
          if (end_holder_at == std::chrono::steady_clock::time_point::max()) {
            log("the bell's lock is still taken (waiters poll meanwhile), retrying");
            end_holder_at = now + stale_bell_after;
          } else if (now >= end_holder_at) {
            end_bell_holder(m);
            end_holder_at = now + stale_bell_after;
          }
          wait(-1, pause_ms);
          pause_ms = std::min(pause_ms * 2, 1000);
          continue;
        }
        if (b == bell_lock_state::failed)
          log(std::string("cannot take the bell's lock (waiters poll meanwhile): ") +
              mysql_error(m));
        try_lock = false;
        live_.store(b == bell_lock_state::taken);
      }
      if (!sleep_once(m)) {
        if (!stop_.load()) log(std::string("connection lost, reconnecting: ") + mysql_error(m));
        break;
      }
    }
    live_.store(false);
    session_.store(0);
    watched_.unconfirm_all(
        cb_.confirmed);  // confirmed again after the next connection's first sleep
  }
  void run() {
    int backoff_ms = 10;
    while (!stop_.load()) {
      if (!wanted()) {
        wait(-1, -1);  // connect only once the handle has a waiter
        continue;
      }
      MYSQL* m = connect();
      if (!m) {
        wait(-1, backoff_ms);
        backoff_ms = std::min(backoff_ms * 2, 1000);
        continue;
      }
      backoff_ms = 10;
      serve(m);
      mysql_close(m);
      if (!stop_.load()) cb_.lost();
    }
  }

  const std::vector<endpoint> eps_;
  const std::string waiters_, locks_;
  bell_callbacks cb_;
  const std::string mark_;
  const std::string heads_, free_, sleep_, plain_sleep_;  // statements built once
  int quick_rounds_ = 0;  // sleeps in a row that ended at once on a free lease (the thread's)
  poke_fd poke_;
  std::atomic<bool> stop_{false}, live_{false};
  std::atomic<std::int64_t> session_{0};  // the server session id of the connection
  watched_waiters watched_;               // this handle's waiters
  std::thread thread_;
};

}  // namespace

std::string doorbell::target(const parsed_url& u, const database_options& o) const {
  detail::doorbell::target(u, o);  // refuses listen_url
  auto q = [&u](const char* k) {
    const auto it = u.query.find(k);
    return it == u.query.end() ? std::string() : it->second;
  };
  std::string out;
  for (const auto& h : u.hosts) {
    const std::vector<std::string> f = {h.host.empty() ? std::string("localhost") : h.host,
                                        u.user,
                                        u.password.value_or(""),
                                        u.path,
                                        q("unix_socket"),
                                        q("sslca"),
                                        q("sslcert"),
                                        q("sslkey"),
                                        std::to_string(h.port.value_or(0)),
                                        std::to_string(ceil_seconds(o.connect_timeout, 1))};
    std::string line;
    for (std::size_t i = 0; i < f.size(); ++i) {
      // A value the target cannot carry: no sleeping connection, the handle's waiters poll.
      if (f[i].find(field_sep) != std::string::npos || f[i].find('\n') != std::string::npos)
        return {};
      if (i) line += field_sep;
      line += f[i];
    }
    out += (out.empty() ? "" : "\n") + line;
  }
  return out;
}

std::unique_ptr<bell_channel> doorbell::open(const std::string& target, const table_names& t,
                                             bell_callbacks cb) const {
  return std::make_unique<channel>(parse_target(target), t.waiters, t.lock, std::move(cb));
}

}  // namespace dblock::detail::my
