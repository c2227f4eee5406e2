#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <thread>

#include "backend.hpp"
#include "core/identifier.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::pg {
namespace {

constexpr const char* backend_start_us = "(extract(epoch FROM backend_start) * 1000000)::bigint";

// "host:port" libpq is connected to (no round trip).
std::string server_of(soci::session& sql) {
  const char* h = PQhost(raw(sql));
  const char* p = PQport(raw(sql));
  return std::string(h ? h : "") + ":" + (p ? p : "");
}

}  // namespace

std::string connector::connect_string(const parsed_url& u, const database_options& o) const {
  check_query_keys(u, {"host",
                       "hostaddr",
                       "sslmode",
                       "sslrootcert",
                       "sslcert",
                       "sslkey",
                       "sslcrl",
                       "application_name",
                       "connect_timeout",
                       "options",
                       "target_session_attrs",
                       "keepalives",
                       "keepalives_idle",
                       "keepalives_interval",
                       "keepalives_count",
                       "tcp_user_timeout",
                       "gssencmode",
                       "channel_binding",
                       "passfile",
                       "pooler"});
  std::string s;
  auto add = [&s](const std::string& k, const std::string& v) {
    s += (s.empty() ? "" : " ") + k + "=" + conn_quote(v);
  };
  if (u.hosts.size() > 1) {
    // libpq's own multi-host handling: it tries the hosts in order (target_session_attrs picks
    // the primary). An empty port item means the default port.
    if (u.query.count("host") || u.query.count("hostaddr"))
      throw error(errc::invalid_argument, "invalid database URL '" + u.redacted +
                                              "': a host list and a host= or hostaddr= "
                                              "parameter cannot be combined");
    std::string hosts, ports;
    for (std::size_t i = 0; i < u.hosts.size(); ++i) {
      hosts += (i ? "," : "") + u.hosts[i].host;
      ports += (i ? "," : "") + (u.hosts[i].port ? std::to_string(*u.hosts[i].port) : "");
    }
    add("host", hosts);
    add("port", ports);
  } else {
    if (!u.host.empty()) add("host", u.host);
    if (u.port) add("port", std::to_string(*u.port));
  }
  add("dbname", u.path);
  if (!u.user.empty()) add("user", u.user);
  if (u.password) add("password", *u.password);
  // The URL's connect_timeout is in `o` (adjust_options), where a deadline also reads it.
  add("connect_timeout", std::to_string(ceil_seconds(o.connect_timeout, 2)));
  if (!u.query.count("application_name")) add("application_name", "dblock");
  for (const auto& kv : u.query)
    if (kv.first != "pooler" && kv.first != "connect_timeout") add(kv.first, kv.second);
  return s;
}

void connector::adjust_options(const parsed_url& u, database_options& o) const {
  url_connect_timeout(u, o);
  auto it = u.query.find("pooler");
  if (it == u.query.end()) return;
  if (it->second == "none")
    o.pooler = pooler_mode::none;
  else if (it->second == "session")
    o.pooler = pooler_mode::session;
  else if (it->second == "transaction")
    o.pooler = pooler_mode::transaction;
  else
    throw error(errc::invalid_argument, "invalid database URL '" + u.redacted + "': pooler='" +
                                            printable(it->second) +
                                            "' (expected none, session or transaction)");
}

std::unique_ptr<connection_state> connector::on_connect(soci::session& sql,
                                                        const database_options& o) const {
  auto st = std::make_unique<state>();
  // The library never prints (libpq's default writes notices to stderr); a warning is noted
  // (commit_unreplicated()).
  PQsetNoticeReceiver(
      raw(sql),
      [](void* arg, const PGresult* r) {
        const char* code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        if (code && std::string(code) == "01000") static_cast<state*>(arg)->warned = true;
      },
      st.get());
  // The server's version as it reported it at the start-up (no round trip; behind PgBouncer,
  // the pooler's server_version setting).
  st->product = "PostgreSQL";
  const char* version = PQparameterStatus(raw(sql), "server_version");
  st->version = version ? version : "";
  // Behind a transaction-mode pooler the next statement may run on another server session:
  // there is no session of ours to identify (and end_session() is never asked to end one).
  if (o.pooler == pooler_mode::transaction) {
    st->pooled = true;
    return st;
  }
  long long pid = 0, start = 0;
  sql << "SELECT pid, " << backend_start_us
      << " FROM pg_stat_activity WHERE pid = pg_backend_pid()",
      soci::into(pid), soci::into(start);
  st->server.id = pid;
  // The backend's start time, and the host libpq connected to (with several hosts, a later
  // connection may reach another server, where the same pid means nothing).
  st->server.tag = std::to_string(start) + " " + server_of(sql);
  return st;
}

std::string connector::isolation_sql(isolation_level level) const {
  std::string s = detail::connector::isolation_sql(level);
  // PostgreSQL spells the session default differently from MySQL.
  const std::string mysql_form = "SET SESSION TRANSACTION";
  if (s.compare(0, mysql_form.size(), mysql_form) == 0)
    s = "SET SESSION CHARACTERISTICS AS TRANSACTION" + s.substr(mysql_form.size());
  return s;
}

bool connector::end_session(soci::session& sql, const session_ref& s,
                            std::chrono::milliseconds timeout) const {
  if (s.id == 0 || s.tag.empty()) return false;
  const auto space = s.tag.find(' ');
  if (space == std::string::npos || s.tag.substr(space + 1) != server_of(sql)) return false;
  long long pid = s.id, start = std::stoll(s.tag.substr(0, space));
  const std::string match =
      std::string(" FROM pg_stat_activity WHERE pid = :pid AND ") + backend_start_us + " = :start";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int n = 0;
  sql << "SELECT count(pg_terminate_backend(pid))" << match, soci::use(pid, "pid"),
      soci::use(start, "start"), soci::into(n);
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    sql << "SELECT count(*)" << match, soci::use(pid, "pid"), soci::use(start, "start"),
        soci::into(n);
    if (n == 0) return true;  // gone: whatever it ran has committed or rolled back
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
  }
}

void connector::begin(soci::session& sql, const connection_state& st, const database_options& o,
                      std::optional<std::chrono::milliseconds> lock_timeout) const {
  // Behind a transaction-mode pooler the session's isolation level was not set (it would land
  // on whichever server session ran the SET): each transaction names it.
  const std::string iso = st.transaction_pooler ? isolation_sql(o.isolation) : std::string();
  const std::string session_form = "SET SESSION CHARACTERISTICS AS TRANSACTION";
  std::string q = "BEGIN";
  if (iso.compare(0, session_form.size(), session_form) == 0) q += iso.substr(session_form.size());
  // The lock timeout for this transaction only (SET LOCAL ends with it), in the same round trip
  // as BEGIN: one simple query of two statements. lock_timeout 0 would mean "no limit"; 1 ms
  // is "do not wait". The value is an integer, so it is safe to splice.
  if (lock_timeout)
    q += "; SET LOCAL lock_timeout = '" +
         std::to_string(std::max<long long>(lock_timeout->count(), 1)) + "ms'";
  // The call's deadline, for the server too: each statement of the transaction (its COMMIT's
  // wait for a synchronous standby included) is cancelled by the server itself when it runs
  // past it, even when the client's cancel cannot reach the server.
  if (st.call_deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        *st.call_deadline - std::chrono::steady_clock::now());
    q += "; SET LOCAL statement_timeout = '" +
         std::to_string(std::max<long long>(left.count(), 1)) + "ms'";
  }
  command(raw(sql), q);
}

void connector::commit(soci::session& sql, const connection_state&) const {
  command(raw(sql), "COMMIT");
}

void connector::set_lock_timeout(soci::session& sql, const connection_state&,
                                 std::chrono::milliseconds ms) const {
  std::string value = std::to_string(std::max<long long>(ms.count(), 1)) + "ms", out;
  sql << "SELECT set_config('lock_timeout', :v, false)", soci::use(value), soci::into(out);
}

bool connector::in_transaction(soci::session& sql) const {
  auto st = PQtransactionStatus(raw(sql));
  return st == PQTRANS_INTRANS || st == PQTRANS_INERROR || st == PQTRANS_ACTIVE;
}

bool connector::transaction_failed(soci::session& sql) const {
  return PQtransactionStatus(raw(sql)) == PQTRANS_INERROR;
}

bool connector::has_unique_index(soci::session& sql, const std::string& table,
                                 const std::string& column) const {
  int n = 0;
  sql << "SELECT count(*) FROM pg_catalog.pg_index i"
         " JOIN pg_catalog.pg_class c ON c.oid = i.indrelid"
         " JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace"
         " JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]"
         " WHERE ns.nspname = current_schema() AND c.relname = :t AND a.attname = :c"
         " AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL",
      soci::use(table, "t"), soci::use(column, "c"), soci::into(n);
  return n > 0;
}

bool connector::table_exists(soci::session& sql, const std::string& table) const {
  int n = 0;
  sql << "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = current_schema()"
         " AND tablename = :t",
      soci::use(table), soci::into(n);
  return n > 0;
}

void connector::lock_migrations_in_transaction(soci::session& sql, const std::string& key) const {
  int one = 0;
  sql << "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtext(:k))) AS l", soci::use(key),
      soci::into(one);
}

void connector::lock_migrations(soci::session& sql, const connection_state&,
                                const std::string& key) const {
  int one = 0;
  sql << "SELECT 1 FROM (SELECT pg_advisory_lock(hashtext(:k))) AS l", soci::use(key),
      soci::into(one);
}

void connector::unlock_migrations(soci::session& sql, const std::string& key) const {
  int one = 0;
  sql << "SELECT 1 FROM (SELECT pg_advisory_unlock(hashtext(:k))) AS l", soci::use(key),
      soci::into(one);
}

}  // namespace dblock::detail::pg

namespace dblock::detail::pg {
namespace {
// PQcancel from a thread of its own (it waits for the server to close the cancel connection,
// for ever when the server is frozen), then shutdown(2) of the connection's socket. Behind a
// transaction-mode pooler no cancel request is sent: the server's statement_timeout (each
// transaction carries the call's deadline) ends the statement, and the cut after the grace ends
// the call. PgBouncer 1.18 (Debian 12's) can exit on a cancel request it is still forwarding
// when its client's connection closes ("FATAL ... disconnect_client(): bad client state: 0",
// PgBouncer issue 801, fixed in 1.19), which took down every client of the pooler in a CI run.
class interrupt final : public interrupter {
 public:
  interrupt(PGconn* c, bool pooled) : c_(c), pooled_(pooled) {}
  std::function<void()> cancel() override {
    if (pooled_) return {};
    PGcancel* k = PQgetCancel(c_);
    if (!k) return {};
    std::shared_ptr<PGcancel> owned(k, PQfreeCancel);
    return [owned] {
      char why[256];
      PQcancel(owned.get(), why, sizeof why);
    };
  }
  void cut() noexcept override {
    const int fd = PQsocket(c_);
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  PGconn* c_;
  bool pooled_;
};
}  // namespace

std::unique_ptr<interrupter> connector::interrupter_for(soci::session& sql,
                                                        const connection_state& st) const {
  const auto& pg = static_cast<const state&>(st);
  pg.warned = false;  // only warnings of this use count
  return std::make_unique<interrupt>(raw(sql), pg.pooled);
}

bool connector::commit_unreplicated(connection_state& st) const {
  auto& s = static_cast<state&>(st);
  const bool w = s.warned;
  s.warned = false;
  return w;
}

std::string connector::bounded_connect(const std::string& cs,
                                       std::chrono::milliseconds left) const {
  return with_connect_timeout(cs, ceil_seconds(left, 2));  // libpq: at least 2 s
}

}  // namespace dblock::detail::pg
