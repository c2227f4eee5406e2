// Standard SQL shared by the backends; each backend overrides only what differs.
#include "dialect.hpp"

#include <soci/soci.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <unordered_map>

#include "../identifier.hpp"
#include "../values.hpp"
#include "dblock/error.hpp"

namespace dblock::detail {

void prepare_once(soci::statement& st, const std::string& text) {
  st.alloc();
  st.prepare(text, soci::details::st_one_time_query);
  st.define_and_bind();
}

namespace {
// Sessions live in the pool for the life of a database, so their addresses are stable keys.
// Both are never destroyed: a detached renewal thread may still return its connection while the
// process exits and runs static destructors.
std::mutex& state_mutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::unordered_map<const soci::session*, std::unique_ptr<connection_state>>& states() {
  static auto* m = new std::unordered_map<const soci::session*, std::unique_ptr<connection_state>>;
  return *m;
}
bool ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
}  // namespace

connection_state* state_of(soci::session& sql) noexcept {
  std::lock_guard<std::mutex> lk(state_mutex());
  auto it = states().find(&sql);
  return it == states().end() ? nullptr : it->second.get();
}

void attach_state(soci::session& sql, std::unique_ptr<connection_state> state) {
  std::unique_ptr<connection_state> old;  // destroyed outside the lock
  std::lock_guard<std::mutex> lk(state_mutex());
  auto it = states().find(&sql);
  if (it != states().end()) {
    old = std::move(it->second);
    states().erase(it);
  }
  if (state) states().emplace(&sql, std::move(state));
}

session_ref session_of(soci::session& sql) noexcept {
  session_ref r;
  std::lock_guard<std::mutex> lk(state_mutex());
  auto it = states().find(&sql);
  if (it != states().end()) {
    r.id = it->second->session_id;
    try {
      r.tag = it->second->session_tag;
    } catch (...) {
      r.id = 0;
    }
  }
  return r;
}

std::string to_positional(const std::string& sql, const std::vector<std::string>& params) {
  std::string out;
  for (std::size_t i = 0; i < sql.size(); ++i) {
    const bool param = sql[i] == ':' && i + 1 < sql.size() && ident_char(sql[i + 1]) &&
                       (i == 0 || sql[i - 1] != ':');
    if (!param) {
      out += sql[i];
      continue;
    }
    std::size_t j = i + 1;
    while (j < sql.size() && ident_char(sql[j]))
      ++j;
    const std::string name = sql.substr(i + 1, j - i - 1);
    auto it = std::find(params.begin(), params.end(), name);
    if (it == params.end())
      throw error(errc::backend_error, "internal: statement parameter :" + name + " not bound");
    out += "$" + std::to_string(it - params.begin() + 1);
    i = j - 1;
  }
  return out;
}

std::string dialect::quote(std::string_view ident) const {
  return "\"" + std::string(ident) + "\"";
}

value dialect::decode_value(const soci::row& r, std::size_t i) const {
  return value_from_row(r, i);
}

std::string dialect::name_pattern_value(const std::string& glob) const {
  std::string out;
  for (char c : glob) {
    if (c == '*')
      out += '%';
    else if (c == '?')
      out += '_';
    else if (c == '%' || c == '_' || c == '!')
      out += std::string("!") + c;
    else
      out += c;
  }
  return out;
}

std::string dialect::isolation_sql(isolation_level level) const {
  switch (level) {
    case isolation_level::read_committed:
      return "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";
    case isolation_level::repeatable_read:
      return "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ";
    case isolation_level::serializable:
      return "SET SESSION TRANSACTION ISOLATION LEVEL SERIALIZABLE";
    case isolation_level::server_default:
      break;
  }
  return {};
}

void dialect::begin_transaction(soci::session& sql, std::chrono::milliseconds lock_timeout) const {
  set_lock_timeout(sql, lock_timeout);
  sql << begin_write_sql();
}

bool dialect::lock_row_exists(soci::session& sql, const table_names& t,
                              const std::string& name) const {
  // A plain read: it takes no lock, so it never waits for a transaction holding the row.
  int n = 0;
  sql << "SELECT count(*) FROM " << t.lock << " WHERE resource_name = :name",
      soci::use(name, "name"), soci::into(n);
  return n > 0;
}

void dialect::insert_lock_row(soci::session& sql, const table_names& t,
                              const std::string& name) const {
  // A free, expired row (hold_count 0, expires_at = now) whose fence starts above the floor.
  std::string empty;
  long long zero = 0;
  sql << "INSERT INTO " << t.lock
      << " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at, holder_host,"
         " holder_pid, holder_thread) VALUES (:name, :empty, COALESCE((SELECT max_fence FROM "
      << t.floor << " WHERE id = 1), 0) + 1, 0, " << now_sql() << ", " << now_sql()
      << ", :empty2, :zero, :empty3)" << insert_if_absent_suffix(),
      soci::use(name, "name"), soci::use(empty, "empty"), soci::use(empty, "empty2"),
      soci::use(zero, "zero"), soci::use(empty, "empty3");
}

void dialect::ensure_lock_row(soci::session& sql, const table_names& t, const std::string& name,
                              std::chrono::milliseconds lock_timeout) const {
  if (lock_row_exists(sql, t, name)) return;
  set_lock_timeout(sql, lock_timeout);
  atomic_write(sql, [&] { insert_lock_row(sql, t, name); });
}

bool dialect::lease_renew(soci::session& sql, const table_names& t, const std::string& name,
                          const std::string& token, std::int64_t fence, std::int64_t ttl_us) const {
  long long ttl = ttl_us, f = fence;
  soci::statement st(sql);
  st.exchange(soci::use(ttl, "ttl"));
  st.exchange(soci::use(name, "name"));
  st.exchange(soci::use(token, "token"));
  st.exchange(soci::use(f, "fence"));
  prepare_once(st, lease_sql(t).renew);
  st.execute(true);
  return st.get_affected_rows() == 1;
}

bool dialect::lease_release(soci::session& sql, const table_names& t, const std::string& name,
                            const std::string& token, std::int64_t fence) const {
  long long f = fence;
  soci::statement st(sql);
  st.exchange(soci::use(name, "name"));
  st.exchange(soci::use(token, "token"));
  st.exchange(soci::use(f, "fence"));
  prepare_once(st, lease_sql(t).release);
  st.execute(true);
  return st.get_affected_rows() == 1;
}

lease_statements dialect::common_lease_sql(const table_names& t) const {
  lease_statements s;
  // Matching the fence too: a token is never reused across acquisitions in practice, but the
  // fence makes a stale holder's statement miss its successor's row even if it were.
  s.renew = "UPDATE " + t.lock + " SET expires_at = " + plus_us_sql(now_sql(), "ttl") +
            " WHERE resource_name = :name AND owner_token = :token AND fence = :fence"
            " AND hold_count > 0 AND expires_at > " +
            now_sql();
  // expires_at is assigned before hold_count so that MySQL, which evaluates SET left to right,
  // sees the old hold_count like the other backends. A freed lease is also an expired one,
  // which is all that acquire checks.
  s.release = "UPDATE " + t.lock + " SET expires_at = CASE WHEN hold_count <= 1 THEN " + now_sql() +
              " ELSE expires_at END, hold_count = hold_count - 1"
              " WHERE resource_name = :name AND owner_token = :token AND fence = :fence"
              " AND hold_count > 0 AND expires_at > " +
              now_sql();
  return s;
}

std::optional<lease_row> dialect::lease_read(soci::session& sql, const table_names& t,
                                             const std::string& name) const {
  lease_row r;
  long long fence = 0, acquired = 0, expires = 0, now = 0, pid = 0;
  soci::statement st(sql);
  st.exchange(soci::use(name, "name"));
  st.exchange(soci::into(r.name));
  st.exchange(soci::into(r.owner_token));
  st.exchange(soci::into(fence));
  st.exchange(soci::into(r.hold_count));
  st.exchange(soci::into(acquired));
  st.exchange(soci::into(expires));
  st.exchange(soci::into(now));
  st.exchange(soci::into(r.holder_host));
  st.exchange(soci::into(pid));
  st.exchange(soci::into(r.holder_thread));
  prepare_once(st, "SELECT resource_name, owner_token, fence, hold_count, " +
                       epoch_us_sql("acquired_at") + ", " + epoch_us_sql("expires_at") + ", " +
                       epoch_us_sql(now_sql()) + ", holder_host, holder_pid, holder_thread FROM " +
                       t.lock + " WHERE resource_name = :name");
  if (!st.execute(true)) return std::nullopt;
  r.fence = fence;
  r.acquired_at_us = acquired;
  r.expires_at_us = expires;
  r.now_us = now;
  r.holder_pid = pid;
  return r;
}

void dialect::atomic_write(soci::session& sql, const std::function<void()>& body) const {
  (void)sql;
  body();
}

table_names make_table_names(const std::string& prefix) {
  if (!prefix.empty()) {
    bool ok = prefix.size() <= 32 &&
              (std::islower(static_cast<unsigned char>(prefix[0])) || prefix[0] == '_');
    for (unsigned char c : prefix)
      ok = ok && (std::islower(c) || std::isdigit(c) || c == '_');
    if (!ok)
      throw error(errc::invalid_argument,
                  "invalid table prefix '" + printable(prefix) +
                      "': expected [a-z_][a-z0-9_]{0,31} (lower case, so that every backend "
                      "spells the table names the same way)");
  }
  table_names t;
  t.prefix = prefix;
  t.lock = prefix + "resource_lock";
  t.floor = prefix + "resource_lock_fence_floor";
  t.migrations = prefix + "dblock_schema_migrations";
  t.audit = prefix + "resource_lock_audit";
  validate_identifier(t.floor, "table name");
  validate_identifier(t.migrations, "table name");
  return t;
}

std::string apply_prefix(const std::string& sql, const std::string& prefix) {
  static const std::string marker = "{{prefix}}";
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    auto hit = sql.find(marker, pos);
    if (hit == std::string::npos) break;
    out.append(sql, pos, hit - pos);
    out += prefix;
    pos = hit + marker.size();
  }
  out.append(sql, pos, std::string::npos);
  return out;
}

std::vector<std::string> split_statements(const std::string& sql) {
  std::vector<std::string> out;
  std::string current;
  std::size_t pos = 0;
  while (pos < sql.size()) {
    auto nl = sql.find('\n', pos);
    std::string line = sql.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? sql.size() : nl + 1;
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line.compare(first, 2, "--") == 0) continue;
    current += line;
    current += '\n';
    auto last = line.find_last_not_of(" \t\r");
    if (line[last] == ';') {
      current.erase(current.find_last_of(';'));
      out.push_back(current);
      current.clear();
    }
  }
  if (current.find_first_not_of(" \t\r\n") != std::string::npos) out.push_back(current);
  return out;
}

}  // namespace dblock::detail

namespace dblock::detail {

// Defined in the source file that CMake generates from migrations/ (see cmake/embed.cmake).
struct embedded_file {
  const char* backend;
  const char* name;
  const char* text;
};
const std::vector<embedded_file>& embedded_migrations();

std::vector<migration_file> load_migrations(const std::string& backend) {
  std::vector<migration_file> out;
  for (const auto& f : embedded_migrations()) {
    std::string name = f.name;
    if (backend != f.backend || name.size() < 6 ||
        !std::isdigit(static_cast<unsigned char>(name[0])))
      continue;
    out.push_back({std::stoi(name.substr(0, 4)), name, f.text});
  }
  std::sort(out.begin(), out.end(),
            [](const migration_file& a, const migration_file& b) { return a.version < b.version; });
  return out;
}

migration_file load_bootstrap(const std::string& backend) {
  for (const auto& f : embedded_migrations())
    if (backend == f.backend && std::string(f.name) == "bootstrap.sql") return {0, f.name, f.text};
  throw error(errc::backend_error,
              "dblock was built without migrations/" + backend + "/bootstrap.sql");
}

const dialect& dialect_for_scheme(const std::string& scheme) {
  if (scheme == "postgresql") return postgresql_dialect_instance();
  if (scheme == "mysql") return mysql_dialect_instance();
  if (scheme == "sqlite") return sqlite_dialect_instance();
  throw error(errc::invalid_argument, "unknown database scheme '" + scheme + "'");
}

}  // namespace dblock::detail
