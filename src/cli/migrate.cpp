// dblock migrate: create or upgrade dblock's tables.
#include <algorithm>
#include <iostream>

#include "commands.hpp"

namespace dblock::cli {

CLI::App* add_migrate(CLI::App& app, common_options& common, migrate_options& m) {
  auto* migrate = app.add_subcommand("migrate", "create or upgrade dblock's tables");
  add_common(migrate, common);
  migrate->add_flag("--dry-run", m.dry_run, "list applied and pending migrations, change nothing");
  migrate
      ->add_option("--lease-durability", m.lease_durability,
                   "after migrating, make the lease table durable (the default) or fast: writes "
                   "not flushed, leases lost in a crash, fences kept monotonic by an epoch "
                   "(PostgreSQL only; see docs/fast-leases.md)")
      ->check(CLI::IsMember({"durable", "fast"}))
      ->excludes("--dry-run");
  return migrate;
}

int run_migrate(const common_options& c, const migrate_options& m) {
  const bool dry_run = m.dry_run;
  auto db = open_db(c);
  auto r = dblock::migrate(db, dblock::migrate_options{dry_run});
  std::size_t pending = 0;
  for (const auto& f : r.files) {
    bool now =
        std::find(r.applied_now.begin(), r.applied_now.end(), f.version) != r.applied_now.end();
    const char* state = now ? "applied now" : f.applied ? "applied" : "pending";
    if (!f.applied) ++pending;
    std::cout << "  " << f.name << "  " << f.checksum << "  " << state << "\n";
  }
  for (int v : r.unknown_applied)
    std::cout << "  version " << v << " is applied in the database but unknown to this dblock\n";
  if (dry_run)
    std::cout << pending << " pending migration(s) in " << db.redacted_url() << " (dry run)\n";
  else
    std::cout << r.applied_now.size() << " migration(s) applied, schema up to date in "
              << db.redacted_url() << "\n";
  if (!dry_run) {
    if (!m.lease_durability.empty())
      dblock::set_lease_durability(
          db, m.lease_durability == "fast" ? lease_durability::fast : lease_durability::durable);
    const bool fast = dblock::lease_durability_of(db) == lease_durability::fast;
    std::cout << "lease table " << db.lock_table() << ": "
              << (fast ? "fast (not flushed; leases are lost in a crash, fences stay monotonic)"
                       : "durable")
              << "\n";
  }
  return exit_ok;
}

}  // namespace dblock::cli
