// Standard SQL shared by the backends; each backend overrides only what differs.
#include "dialect.hpp"

#include <soci/soci.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "core/identifier.hpp"
#include "dblock/error.hpp"

namespace dblock::detail {

std::string to_positional(const std::string& sql, const std::vector<std::string>& params) {
  std::string out;
  scan_parameters(
      sql, [&](std::string_view text) { out += text; },
      [&](const std::string& name) {
        auto it = std::find(params.begin(), params.end(), name);
        if (it == params.end())
          throw error(errc::backend_error, "internal: statement parameter :" + name + " not bound");
        out += "$" + std::to_string(it - params.begin() + 1);
      });
  return out;
}

long long sql_result::integer(std::size_t row, std::size_t col) const {
  const auto& cell = rows.at(row).at(col);
  if (!cell) return 0;
  try {
    return std::stoll(*cell);
  } catch (const std::exception&) {
    throw error(errc::backend_error, "internal: expected an integer, got '" + *cell + "'");
  }
}

const std::string& sql_result::text(std::size_t row, std::size_t col) const {
  static const std::string empty;
  const auto& cell = rows.at(row).at(col);
  return cell ? *cell : empty;
}

std::string vocabulary::quote(std::string_view ident) const {
  return "\"" + std::string(ident) + "\"";
}

value vocabulary::decode_value(const soci::row& r, std::size_t i) const {
  if (r.get_indicator(i) == soci::i_null) return std::monostate{};
  const auto& props = r.get_properties(i);
  switch (props.get_data_type()) {
    case soci::dt_string:
      return r.get<std::string>(i);
    case soci::dt_double:
      return r.get<double>(i);
    case soci::dt_integer:
      return static_cast<long long>(r.get<int>(i));
    case soci::dt_long_long:
      return r.get<long long>(i);
    case soci::dt_unsigned_long_long:
      return static_cast<long long>(r.get<unsigned long long>(i));
    default:
      throw error(errc::invalid_argument,
                  "column '" + props.get_name() +
                      "' has a type dblock cannot carry (use integer, floating-point or text)");
  }
}

std::optional<value> vocabulary::decode_text(const std::optional<std::string>& cell,
                                             soci::data_type t) const {
  if (!cell) return value(std::monostate{});
  const std::string& s = *cell;
  switch (t) {
    case soci::dt_string:
      return value(s);
    case soci::dt_integer:
    case soci::dt_long_long:
    case soci::dt_unsigned_long_long: {
      if (s.empty()) return std::nullopt;
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(s.c_str(), &end, 10);
      if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
      return value(v);
    }
    case soci::dt_double: {
      if (s.empty()) return std::nullopt;
      errno = 0;
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
      return value(v);
    }
    default:
      return std::nullopt;  // SOCI's path says what it cannot carry
  }
}

std::string vocabulary::queue_ring_all(const table_names& t) const {
  return "SELECT owner_token, bell, 0 FROM " + t.waiters + " WHERE resource_name = :name AND" +
         " expires_at > " + now();
}

std::string vocabulary::queue_ahead(const table_names& t, const std::string& owner) const {
  return "EXISTS (SELECT 1 FROM " + t.waiters +
         " w WHERE w.resource_name = :name AND w.ticket < :ticket AND w.expires_at > " + now() +
         " AND w.owner_token <> " + owner + ")";
}

std::string vocabulary::name_pattern_value(const std::string& glob) const {
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

std::string connector::isolation_sql(isolation_level level) const {
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

std::string vocabulary::name_pattern(const std::string& column, const std::string& param) const {
  return column + " LIKE :" + param + " ESCAPE '!'";
}

void connector::begin(soci::session& sql, const connection_state& st, const database_options&,
                      std::optional<std::chrono::milliseconds> lock_timeout) const {
  if (lock_timeout) set_lock_timeout(sql, st, *lock_timeout);
  sql << "BEGIN";
}

void connector::commit(soci::session& sql, const connection_state&) const {
  sql << "COMMIT";
}

std::uint64_t name_hash(const std::string& name) {
  std::uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::string doorbell::target(const parsed_url&, const database_options& o) const {
  if (!o.listen_url.empty())
    throw error(errc::invalid_argument, "database_options::listen_url is for PostgreSQL only");
  return {};
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
  t.stock = prefix + "stock_segment";
  t.ids = prefix + "id_block";
  t.waiters = prefix + "lock_waiter";
  t.semaphores = prefix + "semaphore";
  t.leaders = prefix + "leader";
  t.runs = prefix + "job_run";
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

namespace {

std::size_t count_of(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size()))
    ++n;
  return n;
}

}  // namespace

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
    // Inside a routine's body, a line ending with ';' ends one of its statements, not the
    // migration's: a PostgreSQL body is dollar-quoted ($$ ... $$); a MySQL/MariaDB routine
    // (CREATE PROCEDURE or FUNCTION without $$) ends at a line that starts in column 0, its
    // body's lines being indented.
    const bool in_dollars = count_of(current, "$$") % 2 == 1;
    const bool mysql_body =
        (current.rfind("CREATE PROCEDURE", 0) == 0 || current.rfind("CREATE FUNCTION", 0) == 0) &&
        current.find("$$") == std::string::npos && first > 0;
    if (line[last] == ';' && !in_dollars && !mysql_body) {
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
    const std::string mysql_tag = ".mysql.sql";
    std::optional<flavor> only;
    if (name.size() > mysql_tag.size() &&
        name.compare(name.size() - mysql_tag.size(), mysql_tag.size(), mysql_tag) == 0)
      only = flavor::mysql;
    out.push_back({std::stoi(name.substr(0, 4)), name, f.text, only});
  }
  std::stable_sort(out.begin(), out.end(), [](const migration_file& a, const migration_file& b) {
    return a.version < b.version;
  });
  return out;
}

std::vector<migration_file> migrations_for(const std::vector<migration_file>& all, flavor f) {
  std::vector<migration_file> out;
  for (const auto& m : all) {
    if (m.only && *m.only != f) continue;
    const bool replaced = !m.only && std::any_of(all.begin(), all.end(), [&](const auto& o) {
      return o.version == m.version && o.only == f;
    });
    if (!replaced) out.push_back(m);
  }
  return out;
}

migration_file load_bootstrap(const std::string& backend) {
  for (const auto& f : embedded_migrations())
    if (backend == f.backend && std::string(f.name) == "bootstrap.sql")
      return {0, f.name, f.text, std::nullopt};
  throw error(errc::backend_error,
              "dblock was built without migrations/" + backend + "/bootstrap.sql");
}

const dialect& dialect_for_scheme(const std::string& scheme) {
  if (scheme == "postgresql") return postgresql_dialect();
  if (scheme == "mysql") return mysql_dialect();
  if (scheme == "sqlite") return sqlite_dialect();
  throw error(errc::invalid_argument, "unknown database scheme '" + scheme + "'");
}

}  // namespace dblock::detail
