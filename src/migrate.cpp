#include "dblock/migrate.hpp"

#include <soci/soci.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "database_impl.hpp"

namespace dblock {
namespace {

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

struct applied_row {
  std::string name;
  std::string checksum;
};

std::map<int, applied_row> read_applied(soci::session& sql, const detail::table_names& t) {
  std::map<int, applied_row> out;
  soci::rowset<soci::row> rows =
      (sql.prepare << "SELECT version, name, checksum FROM " << t.migrations);
  for (const auto& r : rows) {
    // Column types differ per backend (INTEGER vs BIGINT); read through long long where needed.
    int version = r.get_properties(0).get_data_type() == soci::dt_long_long
                      ? static_cast<int>(r.get<long long>(0))
                      : r.get<int>(0);
    out[version] = {r.get<std::string>(1), r.get<std::string>(2)};
  }
  return out;
}

}  // namespace

migrate_result migrate(const database& db, migrate_options options) {
  const auto& impl = db.impl();
  const auto& dia = *impl->dia;
  const auto& t = impl->tables;
  const std::string key = "dblock_migrate_" + t.prefix;

  return detail::with_session(impl, "migrate", [&](soci::session& sql) {
    migrate_result result;
    for (const auto& f : dia.migrations())
      result.files.push_back({f.version, f.name, checksum_of(f.text), false});

    dia.lock_migrations(sql, key);
    struct unlock_guard {
      const detail::dialect& d;
      soci::session& s;
      const std::string& k;
      ~unlock_guard() {
        try {
          d.unlock_migrations(s, k);
        } catch (...) {
        }
      }
    } unlock{dia, sql, key};

    std::map<int, applied_row> applied;
    if (!options.dry_run) {
      for (const auto& stmt :
           detail::split_statements(detail::apply_prefix(dia.bootstrap().text, t.prefix)))
        sql << stmt;
    }
    if (dia.table_exists(sql, t.migrations)) applied = read_applied(sql, t);

    for (auto& f : result.files) {
      auto it = applied.find(f.version);
      if (it == applied.end()) continue;
      if (it->second.checksum != f.checksum)
        throw error(errc::schema_mismatch,
                    "migrate: applied migration " + f.name + " has checksum " +
                        it->second.checksum + " in the database but " + f.checksum +
                        " in this build: an applied file was edited; add a new migration "
                        "instead (nothing was applied)");
      f.applied = true;
    }
    for (const auto& kv : applied) {
      bool known = std::any_of(result.files.begin(), result.files.end(),
                               [&](const migration_info& f) { return f.version == kv.first; });
      if (!known) result.unknown_applied.push_back(kv.first);
    }
    if (options.dry_run) return result;

    for (auto& f : result.files) {
      if (f.applied) continue;
      const auto& file =
          *std::find_if(dia.migrations().begin(), dia.migrations().end(),
                        [&](const detail::migration_file& m) { return m.version == f.version; });
      sql << dia.begin_write_sql();
      try {
        int already = 0;
        sql << "SELECT count(*) FROM " << t.migrations << " WHERE version = :v",
            soci::use(f.version), soci::into(already);
        if (already == 0) {
          for (const auto& stmt :
               detail::split_statements(detail::apply_prefix(file.text, t.prefix)))
            sql << stmt;
          sql << "INSERT INTO " << t.migrations
              << " (version, name, checksum, applied_at) VALUES (:v, :n, :c, " << dia.now_sql()
              << ")",
              soci::use(f.version), soci::use(f.name), soci::use(f.checksum);
          result.applied_now.push_back(f.version);
        }
        sql << "COMMIT";
      } catch (...) {
        try {
          sql << "ROLLBACK";
        } catch (...) {
        }
        throw;
      }
      f.applied = true;
    }
    return result;
  });
}

bool schema_up_to_date(const database& db) {
  auto r = migrate(db, migrate_options{true});
  return std::all_of(r.files.begin(), r.files.end(),
                     [](const migration_info& f) { return f.applied; });
}

}  // namespace dblock
