#include "dblock/migrate.hpp"

#include "dblock/version.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "dialect/dialect.hpp"
#include "storage/lock_table.hpp"
#include "storage/write_scope.hpp"

namespace dblock {
namespace {

using detail::session_scope;

std::string checksum_of(const std::string& text) {
  // FNV-1a 64: detects edits of applied files; not a security measure.
  std::uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The cross-process migration lock: held for the session and released on every way out, or,
// where the connection cannot keep a session-level lock (behind a transaction-mode pooler),
// taken again in each of migrate's transactions (in_transaction()).
struct migration_lock {
  session_scope& s;
  std::string key;
  bool per_transaction;
  migration_lock(session_scope& scope, std::string k)
      : s(scope),
        key(std::move(k)),
        per_transaction(!s.dia().conn.session_migration_lock(s.state())) {
    if (!per_transaction) s.dia().conn.lock_migrations(s.sql(), s.state(), key);
  }
  ~migration_lock() {
    if (per_transaction) return;
    try {
      s.dia().conn.unlock_migrations(s.sql(), key);
    } catch (...) {
    }
  }
  void in_transaction() {
    if (per_transaction) s.dia().conn.lock_migrations_in_transaction(s.sql(), key);
  }
};

// Marks the files already applied; throws schema_mismatch for an edited one.
void compare_applied(migrate_result& result,
                     const std::map<int, detail::applied_migration>& applied) {
  for (auto& f : result.files) {
    auto it = applied.find(f.version);
    if (it == applied.end()) continue;
    if (it->second.checksum != f.checksum)
      throw error(errc::schema_mismatch,
                  "migrate: applied migration " + f.name + " has checksum " + it->second.checksum +
                      " in the database but " + f.checksum +
                      " in this build: an applied file was edited; add a new migration "
                      "instead (nothing was applied)");
    f.applied = true;
  }
  for (const auto& kv : applied) {
    bool known = std::any_of(result.files.begin(), result.files.end(),
                             [&](const migration_info& f) { return f.version == kv.first; });
    if (!known) result.unknown_applied.push_back(kv.first);
  }
}

// Applies the missing files, each in its own write transaction.
void apply_missing(session_scope& s, migration_lock& lock, migrate_result& result,
                   const std::vector<detail::migration_file>& files) {
  for (auto& f : result.files) {
    if (f.applied) continue;
    const auto& file = *std::find_if(files.begin(), files.end(),
                                     [&](const auto& m) { return m.version == f.version; });
    detail::write_scope w(s, detail::write_kind::transaction, "migrate " + f.name);
    lock.in_transaction();
    const bool applied_now = detail::lock_table::apply(s, file, f.checksum);
    w.commit();
    if (applied_now) result.applied_now.push_back(f.version);
    f.applied = true;
  }
}

}  // namespace

migrate_result migrate(const database& db, migrate_options options) {
  const auto& impl = detail::access::impl(db);
  return detail::with_session(impl, "migrate", [&](session_scope& s) {
    migrate_result result;
    // The server's flavor picks a version's file where the flavors differ (MySQL 8, MariaDB).
    const auto files = detail::migrations_for(s.dia().migrations, s.state().dialect_flavor);
    for (const auto& f : files)
      result.files.push_back({f.version, f.name, checksum_of(f.text), false});
    migration_lock lock(s, "dblock_migrate_" + s.tables().prefix);
    if (!options.dry_run && lock.per_transaction) {
      detail::write_scope w(s, detail::write_kind::transaction, "migrate (bootstrap)");
      lock.in_transaction();
      detail::lock_table::bootstrap(s);
      w.commit();
    } else if (!options.dry_run) {
      detail::lock_table::bootstrap(s);
    }
    compare_applied(result, detail::lock_table::applied(s));
    if (options.dry_run) return result;
    apply_missing(s, lock, result, files);
    return result;
  });
}

std::string migration_sql(const database& db, bool all) {
  const auto& impl = *detail::access::impl(db);
  // With `all` nothing is read: the files of the dialect's standard flavor (MariaDB's on the
  // MySQL backend; the script says so). Otherwise those of the server's flavor.
  auto fl = detail::flavor::standard;
  if (!all)
    fl = detail::with_session(detail::access::impl(db), "migration script",
                              [](session_scope& s) { return s.state().dialect_flavor; });
  const auto files = detail::migrations_for(impl.dia->migrations, fl);
  std::vector<bool> applied(files.size(), false);
  if (!all) {
    const auto r = migrate(db, migrate_options{true});
    for (std::size_t i = 0; i < r.files.size() && i < applied.size(); ++i)
      applied[i] = r.files[i].applied;
  }
  const std::string& prefix = impl.tables.prefix;
  auto statements = [&prefix, &impl](const std::string& text) {
    std::string out;
    for (const auto& st : detail::split_statements(detail::apply_prefix(text, prefix)))
      out += impl.dia->sql.script_statement(st);
    return out;
  };
  std::size_t count = 0;
  std::string body;
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (applied[i]) continue;
    const auto& f = files[i];
    const std::string sum = checksum_of(f.text);
    // Each file with its record in one transaction where DDL is transactional, as migrate()
    // runs it: a file that fails half-way leaves nothing behind.
    body += "\n-- " + f.name + " (checksum " + sum + ")\n" + impl.dia->sql.script_begin() +
            statements(f.text);
    body += detail::migration_record_script(impl.dia->sql, impl.tables, f.version, f.name, sum) +
            impl.dia->sql.script_commit();
    ++count;
  }
  std::string out =
      "-- dblock " + std::string(version()) + ": " + std::to_string(count) +
      (all ? " migration(s), all" : " pending migration(s)") + " for " + impl.backend +
      (impl.dia->sql.flavor_name(fl).empty() ? std::string()
                                             : " (" + impl.dia->sql.flavor_name(fl) + ")") +
      ", table prefix '" + prefix + "'.\n";
  out +=
      "-- Run in order as the tables' owner, stopping at the first error; afterwards\n"
      "-- `dblock migrate --dry-run` reports the schema up to date.\n";
  out += "\n-- the bookkeeping of applied migrations\n" + statements(impl.dia->bootstrap.text);
  return out + body;
}

bool schema_up_to_date(const database& db) {
  auto r = migrate(db, migrate_options{true});
  return std::all_of(r.files.begin(), r.files.end(),
                     [](const migration_info& f) { return f.applied; });
}

}  // namespace dblock
