// dblock migrate: create or upgrade dblock's tables.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>

#include "commands.hpp"

namespace dblock::cli {

CLI::App* add_migrate(CLI::App& app, common_options& common, migrate_options& m) {
  auto* migrate = app.add_subcommand("migrate", "create or upgrade dblock's tables");
  add_common(migrate, common);
  auto* dry = migrate->add_flag("--dry-run", m.dry_run,
                                "list applied and pending migrations, change nothing; exit 0 "
                                "when the schema is up to date, 1 when migrations are pending");
  auto* print = migrate->add_flag(
      "--print-sql", m.print_sql,
      "print the SQL of the pending migrations (with --all: of every migration), table prefix "
      "filled in, each followed by the INSERT that records it, for a DBA or a schema tool to "
      "run instead; change nothing");
  migrate
      ->add_flag("--all", m.all,
                 "with --print-sql: every migration, not only the pending "
                 "ones (reads nothing from the database)")
      ->needs(print);
  migrate->add_flag("--json", m.json, "print JSON instead of text");
  print->excludes(dry);
  migrate
      ->add_option("--lease-durability", m.lease_durability,
                   "after migrating, make the lease table durable (the default) or fast: writes "
                   "not flushed, leases lost in a crash, fences kept monotonic by an epoch "
                   "(PostgreSQL only; see docs/fast-leases.md)")
      ->check(CLI::IsMember({"durable", "fast"}))
      ->excludes(dry)
      ->excludes(print);
  return migrate;
}

int run_migrate(const common_options& c, const migrate_options& m) {
  auto db = open_db(c);
  if (m.print_sql) {
    const std::string sql = dblock::migration_sql(db, m.all);
    if (m.json)
      std::cout << nlohmann::json{{"version", dblock::version()}, {"sql", sql}}.dump(2) << "\n";
    else
      std::cout << sql;
    return exit_ok;
  }
  const bool dry_run = m.dry_run;
  auto r = dblock::migrate(db, dblock::migrate_options{dry_run});
  std::size_t pending = 0;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : r.files) {
    bool now =
        std::find(r.applied_now.begin(), r.applied_now.end(), f.version) != r.applied_now.end();
    const char* state = now ? "applied now" : f.applied ? "applied" : "pending";
    if (!f.applied) ++pending;
    files.push_back({{"name", f.name}, {"checksum", f.checksum}, {"state", state}});
    if (!m.json) std::cout << "  " << f.name << "  " << f.checksum << "  " << state << "\n";
  }
  if (!m.json)
    for (int v : r.unknown_applied)
      std::cout << "  version " << v << " is applied in the database but unknown to this dblock\n";
  std::string durability;
  if (!dry_run) {
    if (!m.lease_durability.empty())
      dblock::set_lease_durability(
          db, m.lease_durability == "fast" ? lease_durability::fast : lease_durability::durable);
    durability = dblock::lease_durability_of(db) == lease_durability::fast ? "fast" : "durable";
  }
  if (m.json) {
    nlohmann::json j{{"version", dblock::version()},
                     {"url", db.redacted_url()},
                     {"dry_run", dry_run},
                     {"migrations", files},
                     {"applied_now", r.applied_now.size()},
                     {"pending", pending},
                     {"unknown_applied", r.unknown_applied}};
    if (!dry_run) j["lease_durability"] = durability;
    std::cout << j.dump(2) << "\n";
  } else if (dry_run) {
    std::cout << pending << " pending migration(s) in " << db.redacted_url() << " (dry run)\n";
  } else {
    std::cout << r.applied_now.size() << " migration(s) applied, schema up to date in "
              << db.redacted_url() << "\n";
    std::cout << "lease table " << db.lock_table() << ": "
              << (durability == "fast"
                      ? "fast (not flushed; leases are lost in a crash, fences stay monotonic)"
                      : "durable")
              << "\n";
  }
  // A dry run gates a deploy: not up to date is a status of its own.
  return dry_run && pending > 0 ? exit_pending : exit_ok;
}

}  // namespace dblock::cli
