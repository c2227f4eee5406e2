#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::my {

std::string connector::connect_string(const parsed_url& u, const database_options& o) const {
  check_query_keys(u, {"unix_socket", "charset", "connect_timeout", "read_timeout", "write_timeout",
                       "sslca", "sslcert", "sslkey"});
  std::string s;
  auto add = [&s](const std::string& k, const std::string& v) {
    s += (s.empty() ? "" : " ") + k + "=" + conn_quote(v);
  };
  add("host", u.host.empty() ? std::string("localhost") : u.host);
  if (u.port) add("port", std::to_string(*u.port));
  add("db", u.path);
  if (!u.user.empty()) add("user", u.user);
  if (u.password) add("password", *u.password);
  if (!u.query.count("charset")) add("charset", "utf8mb4");
  // The URL's connect_timeout is in `o` (adjust_options), where a deadline also reads it.
  add("connect_timeout", std::to_string(ceil_seconds(o.connect_timeout, 1)));
  for (const auto& kv : u.query)
    if (kv.first != "connect_timeout") add(kv.first, kv.second);
  return s;
}

void connector::adjust_options(const parsed_url& u, database_options& o) const {
  // SOCI reads these as unsigned numbers and refuses anything else only when connecting.
  check_url_seconds(u, "read_timeout");
  check_url_seconds(u, "write_timeout");
  // SOCI 4.0.3 hands the TLS files to the client only with a CA file: without sslca, sslcert and
  // sslkey would be dropped without a word.
  if ((u.query.count("sslcert") || u.query.count("sslkey")) && !u.query.count("sslca"))
    throw error(errc::invalid_argument,
                "invalid database URL '" + u.redacted +
                    "': sslcert and sslkey need sslca (the CA file that verifies the server)");
  url_connect_timeout(u, o);
}

std::vector<std::string> connector::connect_strings(const parsed_url& u,
                                                    const database_options& o) const {
  // The client library takes one host: dblock tries them in order (see database_impl::lease).
  std::vector<std::string> out;
  for (const auto& h : u.hosts) {
    parsed_url one = u;
    one.host = h.host;
    one.port = h.port;
    out.push_back(connect_string(one, o));
  }
  return out;
}

namespace {

// An ISO 8601 duration as Galera prints its timeouts ("PT5S", "PT0.5S", "PT1M30S", "P1D");
// nullopt when it is not one.
std::optional<std::chrono::milliseconds> iso_duration(const std::string& text) {
  if (text.size() < 3 || text[0] != 'P') return std::nullopt;
  double total = 0;
  bool time = false, any = false;
  std::size_t i = 1;
  while (i < text.size()) {
    if (text[i] == 'T') {
      time = true;
      ++i;
      continue;
    }
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(i), &used);
    } catch (...) {
      return std::nullopt;
    }
    i += used;
    if (used == 0 || i >= text.size() || v < 0) return std::nullopt;
    const char unit = text[i++];
    if (!time && unit == 'D')
      total += v * 86400;
    else if (time && unit == 'H')
      total += v * 3600;
    else if (time && unit == 'M')
      total += v * 60;
    else if (time && unit == 'S')
      total += v;
    else
      return std::nullopt;
    any = true;
  }
  if (!any || total > 1e9) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(total * 1000 + 0.5));
}

// Galera's failure detection from its provider options: a node silent for evs.suspect_timeout
// is suspected, and dropped from the view once the others agree (measured here: a killed node
// was dropped 2.7-4 s after the kill with evs.suspect_timeout PT3S), hence + 1 s.
void read_galera_detection(soci::session& sql, connection_state& st) {
  std::string options;
  soci::indicator ind = soci::i_ok;
  sql << "SELECT @@GLOBAL.wsrep_provider_options", soci::into(options, ind);
  if (ind != soci::i_ok) return;
  const std::string key = "evs.suspect_timeout";
  auto at = options.find(key);
  if (at == std::string::npos) return;
  at = options.find_first_not_of(" =", at + key.size());
  if (at == std::string::npos) return;
  const std::string value = options.substr(at, options.find(';', at) - at);
  const auto d = iso_duration(value.substr(0, value.find_last_not_of(' ') + 1));
  if (!d) return;
  st.failure_detection = *d + std::chrono::seconds(1);
  st.failure_detection_source =
      "Galera evs.suspect_timeout " + value.substr(0, 32) + " + 1 s for the view change";
}

// A global variable or status value of the server (`what`: "VARIABLES" or "STATUS"); nullopt
// when the server has none of that name. SHOW answers on MariaDB and MySQL 8 alike (MySQL 8
// removed information_schema's GLOBAL_VARIABLES and GLOBAL_STATUS). `pattern` is ours, a LIKE
// pattern with '_' escaped.
std::optional<std::string> show_global(soci::session& sql, const char* what, const char* pattern) {
  std::string name, value;
  soci::indicator name_ind = soci::i_ok, value_ind = soci::i_ok;
  sql << "SHOW GLOBAL " << what << " LIKE '" << pattern << "'", soci::into(name, name_ind),
      soci::into(value, value_ind);
  if (!sql.got_data() || value_ind != soci::i_ok) return std::nullopt;
  return value;
}

// Test builds only (DBLOCK_TEST_HOOKS): DBLOCK_TEST_MYSQL_FLAVOR=mysql makes a MariaDB server's
// connections take the MySQL 8 flavor, so that the suite runs that flavor's statements, migrations
// and routines on MariaDB (docs/testing.md).
bool test_wants_mysql_flavor() {
#ifdef DBLOCK_TEST_HOOKS
  const char* f = std::getenv("DBLOCK_TEST_MYSQL_FLAVOR");
  return f && std::string(f) == "mysql";
#else
  return false;
#endif
}

// MariaDB names itself in its version ("10.11.6-MariaDB-0+deb12u1"); MySQL 8 and its
// derivatives do not ("8.4.3", "8.0.39-30" for Percona Server). MySQL before 8.0 lacks what
// dblock uses (SKIP LOCKED, NOWAIT, recursive CTEs of the admin views): refused.
void read_product(const std::string& version, state& st, const std::string& node) {
  st.version = version;
  if (version.find("MariaDB") != std::string::npos) {
    st.product = "MariaDB";
    st.dialect_flavor = test_wants_mysql_flavor() ? flavor::mysql : flavor::standard;
    return;
  }
  st.product = "MySQL";
  st.dialect_flavor = flavor::mysql;
  int major = 0;
  try {
    major = std::stoi(version);
  } catch (...) {
  }
  if (major < 8)
    throw error(
        errc::connection_failed,
        "MySQL server " + node + " is version " + version + ": dblock needs MySQL 8.0 or later",
        "mysql", "", 0);
}

}  // namespace

std::unique_ptr<connection_state> connector::on_connect(soci::session& sql,
                                                        const database_options&) const {
  auto st = std::make_unique<state>();
  long long id = 0;
  std::string host, node, version;
  // The server session (id and this client's "address:port"), the node it runs on, and the
  // server's version (its product and dblock's flavor for it).
  sql << "SELECT p.ID, p.HOST, CONCAT(@@hostname, ':', @@port), @@version FROM "
         "information_schema.PROCESSLIST p WHERE p.ID = CONNECTION_ID()",
      soci::into(id), soci::into(host), soci::into(node), soci::into(version);
  read_product(version, *st, node);
  // Whether that node is a Galera node that is part of the cluster's primary component.
  const auto wsrep_on = show_global(sql, "VARIABLES", "wsrep\\_on");
  st->galera = wsrep_on && *wsrep_on == "ON";
  if (st->galera && show_global(sql, "STATUS", "wsrep\\_ready").value_or("") != "ON")
    throw error(errc::connection_failed,
                "Galera node " + node +
                    " is not ready (wsrep_ready is not ON): it is not part of the cluster's "
                    "primary component",
                "mysql", "", 1047);
  // Strict mode: an over-long value is an error, never silently truncated. On Galera, reads
  // wait until the node has applied everything committed in the cluster before they began
  // (wsrep_sync_wait = 1), so that a read-back deciding an outcome sees the latest state.
  sql << std::string(
             "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), "
             "'STRICT_ALL_TABLES')") +
             (st->galera ? ", SESSION wsrep_sync_wait = 1" : "");
  if (st->galera) read_galera_detection(sql, *st);
  st->server.id = id;
  st->server.tag = host + " " + node;  // this client as the server sees it, and the node
  return st;
}

const char* connector::session_lease_refusal(const connection_state& st) const {
  if (st.dialect_flavor == flavor::mysql)
    return "is not available on MySQL 8 (a session lease's fences come from a SEQUENCE, which "
           "MySQL has not; see docs/mysql.md); use the durable mode, the default";
  if (!static_cast<const state&>(st).galera) return nullptr;
  return "cannot work on Galera (GET_LOCK is local to one node: another node's session would get "
         "the same lock); use the durable mode";
}

bool connector::end_session(soci::session& sql, const session_ref& s,
                            std::chrono::milliseconds timeout) const {
  if (s.id == 0 || s.tag.empty()) return false;
  // Session ids are per server: only a connection to the same node can tell whether the session
  // is gone (with several hosts, this one may be on another).
  const auto space = s.tag.find(' ');
  std::string host = s.tag.substr(0, space), node;
  sql << "SELECT CONCAT(@@hostname, ':', @@port)", soci::into(node);
  if (space == std::string::npos || node != s.tag.substr(space + 1)) return false;
  const std::string id = std::to_string(s.id);  // an integer: safe to splice (KILL takes no
                                                // parameters)
  const std::string match =
      " FROM information_schema.PROCESSLIST WHERE ID = " + id + " AND HOST = :host";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int n = 0;
  sql << "SELECT COUNT(*)" << match, soci::use(host, "host"), soci::into(n);
  if (n > 0) {
    try {
      sql << "KILL CONNECTION " << id;
    } catch (const soci::soci_error&) {
      // 1094: it ended meanwhile. Anything else (no permission): the wait below decides.
    }
  }
  for (auto pause = std::chrono::milliseconds(1);;
       pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    sql << "SELECT COUNT(*)" << match, soci::use(host, "host"), soci::into(n);
    if (n == 0) return true;  // gone: its statement has committed or rolled back
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
  }
}

// A transaction's lock timeout stays set after it: the next transaction usually wants the same,
// so it costs no SET round trip before or after. Anything else gets the server's default back
// before it runs (executor::run() and begin_statement() outside a transaction, and
// database::connect() through to_session_defaults()), as if it were reset after each transaction.
void set_lock_wait(soci::session& sql, const connection_state& st, long long seconds) {
  const auto& s = static_cast<const state&>(st);
  if (s.lock_wait_s == seconds) return;
  s.lock_wait_s = -2;  // unknown until the SET has succeeded
  if (seconds < 0)
    sql << "SET SESSION innodb_lock_wait_timeout = DEFAULT";
  else
    sql << "SET SESSION innodb_lock_wait_timeout = " << seconds;
  s.lock_wait_s = seconds;
}

void connector::begin(soci::session& sql, const connection_state& st, const database_options&,
                      std::optional<std::chrono::milliseconds> lock_timeout) const {
  // Without a timeout the server's default applies, as on a fresh connection.
  set_lock_wait(sql, st, lock_timeout ? ceil_seconds(*lock_timeout, 1) : -1);
  sql << "BEGIN";
}

void connector::set_lock_timeout(soci::session& sql, const connection_state& st,
                                 std::chrono::milliseconds ms) const {
  // InnoDB counts whole seconds. 0 would mean "do not wait", but MariaDB 10.11 then fails
  // statements with "Got error 1 'Operation not permitted' during COMMIT", so the shortest
  // wait is one second (NOWAIT and SKIP LOCKED, which dblock uses for "do not wait", are
  // unaffected).
  set_lock_wait(sql, st, ceil_seconds(ms, 1));
}

void connector::to_session_defaults(soci::session& sql, const connection_state& st) const {
  set_lock_wait(sql, st, -1);
}

bool connector::in_transaction(soci::session& sql) const {
  auto* backend = static_cast<soci::mysql_session_backend*>(sql.get_backend());
  return (backend->conn_->server_status & SERVER_STATUS_IN_TRANS) != 0;
}

bool connector::has_unique_index(soci::session& sql, const std::string& table,
                                 const std::string& column) const {
  int n = 0;
  sql << "SELECT count(*) FROM information_schema.statistics s"
         " WHERE s.table_schema = DATABASE() AND s.table_name = :t AND s.column_name = :c"
         " AND s.non_unique = 0 AND s.seq_in_index = 1 AND NOT EXISTS (SELECT 1 FROM"
         " information_schema.statistics s2 WHERE s2.table_schema = s.table_schema"
         " AND s2.table_name = s.table_name AND s2.index_name = s.index_name"
         " AND s2.seq_in_index = 2)",
      soci::use(table, "t"), soci::use(column, "c"), soci::into(n);
  return n > 0;
}

void connector::lock_migrations(soci::session& sql, const connection_state&,
                                const std::string& key) const {
  // GET_LOCK names are at most 64 characters; the key is ours and short.
  soci::indicator ind = soci::i_ok;
  int got = 0;
  sql << "SELECT GET_LOCK(:k, 600)", soci::use(key), soci::into(got, ind);
  if (ind == soci::i_null || got != 1)
    throw error(errc::timeout, "migrate: could not take the migration lock '" + key +
                                   "' within 600 s (another migrator is stuck?)");
}
void connector::unlock_migrations(soci::session& sql, const std::string& key) const {
  soci::indicator ind = soci::i_ok;
  int released = 0;
  sql << "SELECT RELEASE_LOCK(:k)", soci::use(key), soci::into(released, ind);
}
bool connector::table_exists(soci::session& sql, const std::string& table) const {
  int n = 0;
  sql << "SELECT count(*) FROM information_schema.tables WHERE table_schema = DATABASE()"
         " AND table_name = :t",
      soci::use(table), soci::into(n);
  return n > 0;
}

}  // namespace dblock::detail::my

namespace dblock::detail::my {
namespace {
// KILL QUERY from a connection of its own (bounded by the client's own timeouts), then
// shutdown(2) of the connection's socket.
class interrupt final : public interrupter {
 public:
  explicit interrupt(MYSQL* m) : m_(m) {}
  std::function<void()> cancel() override {
    struct target {
      std::string host, user, password, socket;
      unsigned int port;
      unsigned long id;
    };
    auto t = std::make_shared<target>();
    t->host = m_->host ? m_->host : "";
    t->user = m_->user ? m_->user : "";
    t->password = m_->passwd ? m_->passwd : "";
    t->socket = m_->unix_socket ? m_->unix_socket : "";
    t->port = m_->port;
    t->id = mysql_thread_id(m_);
    return [t] {
      MYSQL* k = mysql_init(nullptr);
      if (!k) return;
      const unsigned int seconds = 2;
      mysql_optionsv(k, MYSQL_OPT_CONNECT_TIMEOUT, &seconds);
      mysql_optionsv(k, MYSQL_OPT_READ_TIMEOUT, &seconds);
      mysql_optionsv(k, MYSQL_OPT_WRITE_TIMEOUT, &seconds);
      if (mysql_real_connect(k, t->host.c_str(), t->user.c_str(), t->password.c_str(), nullptr,
                             t->port, t->socket.empty() ? nullptr : t->socket.c_str(), 0))
        mysql_query(k, ("KILL QUERY " + std::to_string(t->id)).c_str());
      mysql_close(k);
    };
  }
  void cut() noexcept override {
    const my_socket fd = mysql_get_socket(m_);
    if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }

 private:
  MYSQL* m_;
};
}  // namespace

std::unique_ptr<interrupter> connector::interrupter_for(soci::session& sql,
                                                        const connection_state&) const {
  return std::make_unique<interrupt>(raw(sql));
}

std::string connector::bounded_connect(const std::string& cs,
                                       std::chrono::milliseconds left) const {
  return with_connect_timeout(cs, ceil_seconds(left, 1));
}

}  // namespace dblock::detail::my
