// dblock status: list held locks and recent forced releases; dblock release: force a stuck lease
// free (audited).
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <iomanip>
#include <iostream>

#include "commands.hpp"

namespace dblock::cli {

namespace {

// A lock's name as shown: a semaphore permit's as "NAME [permit K]", an election's leadership
// as "NAME [leader]".
std::string display_name(const std::string& name) {
  if (auto r = dblock::rwlock::reader_of(name))
    return shown(r->first) + " [reader " + std::to_string(r->second) + "]";
  if (auto p = dblock::semaphore::permit_of(name))
    return shown(p->first) + " [permit " + std::to_string(p->second) + "]";
  if (auto e = dblock::election::election_of(name)) return shown(*e) + " [leader]";
  if (auto q = dblock::semaphore::queue_of(name)) {
    // A read-write lock's readers are a semaphore: its queue holds a writer waiting for them.
    if (auto r = dblock::rwlock::reader_of(*q + "\xEF\xBF\xBF" + "0"))
      return shown(r->first) + " [writer waiting for readers]";
    return shown(*q) + " [waiting for a permit]";
  }
  return shown(name);
}

void print_status_json(const dblock::database& db, const std::vector<dblock::lock_info>& locks,
                       const std::vector<dblock::forced_release>& forced,
                       const dblock::failover_info& fo, const dblock::server_info& server) {
  nlohmann::json j;
  j["version"] = dblock::version();
  j["database"] = db.redacted_url();
  j["server"] = {{"product", server.product}, {"version", server.version}};
  j["failover"] = {
      {"window_ms", fo.window.count()}, {"min_ttl_ms", fo.min_ttl.count()}, {"source", fo.source}};
  j["locks"] = nlohmann::json::array();
  for (const auto& l : locks) {
    j["locks"].push_back({{"name", l.name},
                          {"mode", l.session_mode ? "session" : "row"},
                          {"held", l.held},
                          {"holder", l.holder_host + ":" + std::to_string(l.holder_pid)},
                          {"holder_thread", l.holder_thread},
                          {"owner_token", l.owner_token},
                          {"fence", l.fence},
                          {"hold_count", l.hold_count},
                          {"acquired_at", iso_time(l.acquired_at)},
                          {"expires_at", iso_time(l.expires_at)},
                          {"expires_in_ms", l.expires_in.count() / 1000},
                          {"waiters", l.waiters},
                          {"head_waiter", l.head_waiter},
                          {"oldest_wait_ms", l.oldest_wait.count() / 1000}});
    if (auto r = dblock::rwlock::reader_of(l.name)) {
      j["locks"].back()["rwlock"] = r->first;
      j["locks"].back()["reader"] = r->second;
    } else if (auto p = dblock::semaphore::permit_of(l.name)) {
      j["locks"].back()["semaphore"] = p->first;
      j["locks"].back()["permit"] = p->second;
    }
    if (auto e = dblock::election::election_of(l.name)) j["locks"].back()["election"] = *e;
    if (auto q = dblock::semaphore::queue_of(l.name)) j["locks"].back()["queue_of"] = *q;
  }
  j["forced_releases"] = nlohmann::json::array();
  for (const auto& f : forced)
    j["forced_releases"].push_back({{"name", f.name},
                                    {"previous_fence", f.previous_fence},
                                    {"new_fence", f.new_fence},
                                    {"previous_holder", f.previous_holder},
                                    {"was_held", f.was_held},
                                    {"forced_by", f.forced_by},
                                    {"reason", f.reason},
                                    {"at", iso_time(f.at)}});
  std::cout << j.dump(2) << "\n";
}

void print_status_table(const dblock::database& db, const std::vector<dblock::lock_info>& locks,
                        const std::vector<dblock::forced_release>& forced,
                        std::chrono::system_clock::time_point now, const status_options& s,
                        const dblock::failover_info& fo, const dblock::server_info& server) {
  std::size_t w = 4;
  for (const auto& l : locks)
    w = std::max(w, std::min<std::size_t>(display_name(l.name).size(), 60));
  std::cout << std::left << std::setw(static_cast<int>(w)) << "NAME"
            << "  " << std::setw(28) << "HOLDER" << std::right << std::setw(10) << "FENCE"
            << std::setw(12) << "ACQUIRED" << std::setw(12) << "EXPIRES IN" << std::setw(6)
            << "HOLDS" << std::setw(9) << "WAITERS" << std::setw(12) << "OLDEST WAIT"
            << "  HEAD WAITER\n";
  for (const auto& l : locks) {
    auto ago = std::chrono::duration_cast<std::chrono::microseconds>(now - l.acquired_at);
    // A session lease shows its fence and age once its holder has reported them (its first
    // renewal); until then, and for a free name, its marker's are no holder's.
    const bool unreported = l.session_mode && l.holder_thread == "session";
    std::cout << std::left << std::setw(static_cast<int>(w)) << display_name(l.name).substr(0, 60)
              << "  " << std::setw(28)
              << (l.holder_host + ":" + std::to_string(l.holder_pid)).substr(0, 28) << std::right
              << std::setw(10) << (unreported ? std::string("-") : std::to_string(l.fence))
              << std::setw(12) << (unreported ? std::string("-") : human(ago) + " ago")
              << std::setw(12)
              << (l.session_mode && l.held ? std::string("session")
                  : l.held                 ? human(l.expires_in)
                                           : std::string("free"))
              << std::setw(6) << l.hold_count << std::setw(9) << l.waiters << std::setw(12)
              << (l.waiters ? human(l.oldest_wait) : std::string("-")) << "  "
              << (l.waiters ? l.head_waiter : std::string("-")) << "\n";
  }
  std::cout << locks.size() << (s.all ? " lock row(s)" : " held lock(s)")
            << (s.pattern.empty() ? "" : " matching '" + shown(s.pattern) + "'") << " in "
            << db.redacted_url() << " (" << server.product << " " << shown(server.version) << ")\n";
  if (fo.window.count() > 0)
    std::cout << "failover window " << human(fo.window) << " (" << fo.source
              << "): a lease survives the loss of its holder's node with a TTL of at least "
              << human(fo.min_ttl) << " (default safety margin)\n";
  if (!forced.empty()) {
    std::cout << "\nlast forced releases:\n";
    for (const auto& f : forced)
      std::cout << "  " << iso_time(f.at) << "  " << display_name(f.name) << "  fence "
                << f.previous_fence << " -> " << f.new_fence << "  was "
                << (f.was_held ? "held" : "free") << " by " << f.previous_holder << "  forced by "
                << shown(f.forced_by) << ": " << shown(f.reason) << "\n";
  }
}

std::string who_am_i() {
  const char* user = std::getenv("SUDO_USER");
  if (!user || !*user) user = std::getenv("USER");
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(user && *user ? user : "unknown") + "@" + host;
}

}  // namespace

CLI::App* add_status(CLI::App& app, common_options& common, status_options& s) {
  auto* status = app.add_subcommand("status", "list held locks (and recent forced releases)");
  add_common(status, common);
  status->add_flag("--json", s.json, "print JSON instead of text (docs/cli.md shows its shape)");
  status->add_flag("--all", s.all, "include released and expired rows");
  status->add_option("pattern", s.pattern, "name pattern, shell style: 'jobs/*'");
  return status;
}

int run_status(const common_options& c, const status_options& s) {
  auto db = open_db(c);
  dblock::list_options lo;
  lo.pattern = s.pattern;
  lo.include_free = s.all;
  auto locks = dblock::list_locks(db, lo);
  auto forced = dblock::recent_forced_releases(db, 5);
  const auto fo = db.failover();
  const auto server = db.server();
  const auto now = std::chrono::system_clock::now();
  if (s.json)
    print_status_json(db, locks, forced, fo, server);
  else
    print_status_table(db, locks, forced, now, s, fo, server);
  return exit_ok;
}

CLI::App* add_release(CLI::App& app, common_options& common, release_options& r) {
  auto* release = app.add_subcommand("release", "force a stuck lease free (audited)");
  add_common(release, common);
  release->add_flag("--force", r.force, "required: take the lease from its holder");
  release->add_option("--reason", r.reason, "why (recorded in the audit table)");
  auto* permit = release->add_option(
      "--permit", r.permit, "NAME is a semaphore: release its permit K (as status shows it)");
  auto* leader = release->add_flag("--leader", r.leader, "NAME is an election: depose its leader")
                     ->excludes(permit);
  release
      ->add_option("--reader", r.reader,
                   "NAME is a read-write lock: release its reader K (as status shows it)")
      ->excludes(permit)
      ->excludes(leader);
  release->add_option("name", r.name, "lock name")->required();
  return release;
}

int run_release(const common_options& c, const release_options& r) {
  if (!r.force) {
    std::cerr << "dblock release: releasing someone else's lease is dangerous; pass --force "
                 "(and --reason) to do it\n";
    return exit_usage;
  }
  auto db = open_db(c);
  try {
    std::string name = r.name;
    if (r.reader >= 0)
      name = dblock::rwlock::reader_lease_name(r.name, r.reader);
    else if (r.leader)
      name = dblock::election::lease_name(r.name);
    else if (r.permit >= 0)
      name = dblock::semaphore::permit_lease_name(r.name, r.permit);
    auto f = dblock::force_release(db, name, r.reason, who_am_i());
    std::cout << "released '" << display_name(f.name) << "' (it was "
              << (f.was_held ? "held" : "free") << ", last holder " << f.previous_holder
              << "); fence " << f.previous_fence << " -> " << f.new_fence
              << ", recorded in the audit table\n";
    return exit_ok;
  } catch (const dblock::error& e) {
    if (e.code() != dblock::errc::not_found) throw;
    if (r.permit >= 0)
      std::cerr << "dblock release: semaphore '" << shown(r.name) << "' has no permit " << r.permit
                << " in the lock table (never taken, or reaped)\n";
    else if (r.reader >= 0)
      std::cerr << "dblock release: read-write lock '" << shown(r.name) << "' has no reader "
                << r.reader << " in the lock table (never taken, or reaped)\n";
    else if (r.leader)
      std::cerr << "dblock release: election '" << shown(r.name)
                << "' has no leadership row in the lock table (never won, or reaped)\n";
    else
      std::cerr << "dblock release: " << shown(e.what()) << "\n";
    return exit_not_found;
  }
}

CLI::App* add_row_mode(CLI::App& app, common_options& common, row_mode_options& r) {
  auto* cmd = app.add_subcommand(
      "row-mode", "give a name in session mode back to row mode (docs/session-leases.md)");
  add_common(cmd, common);
  cmd->add_option("--wait", r.wait,
                  "how long to wait for a session lease holding it to release it (default 10s)");
  cmd->add_option("name", r.name, "lock name")->required();
  return cmd;
}

int run_row_mode(const common_options& c, const row_mode_options& r) {
  const auto wait = parse_duration(r.wait, "--wait");
  auto db = open_db(c);
  if (!dblock::leave_session_mode(db, r.name, wait)) {
    std::cerr << "dblock row-mode: '" << shown(r.name)
              << "' is not in session mode (no marker row in " << db.lock_table() << ")\n";
    return exit_not_found;
  }
  std::cout << "'" << display_name(r.name)
            << "' is back in row mode: its next row-mode fence is above every session fence "
               "it had\n";
  return exit_ok;
}

}  // namespace dblock::cli
