// dblock leader: print the current leader of an election (dblock::election::observe).
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.hpp"

namespace dblock::cli {

CLI::App* add_leader(CLI::App& app, common_options& common, leader_options& l) {
  auto* leader = app.add_subcommand(
      "leader", "print the current leader of an election (exit 1 when there is none)");
  add_common(leader, common);
  leader->add_flag("--json", l.json, "print JSON instead of text");
  leader->add_option("name", l.name, "election name")->required();
  return leader;
}

int run_leader(const common_options& c, const leader_options& l) {
  auto db = open_db(c);
  auto info = dblock::election::observe(db, l.name);
  if (l.json) {
    nlohmann::json j;
    j["version"] = dblock::version();
    j["election"] = l.name;
    j["leader"] = nullptr;
    if (info)
      j["leader"] = {{"identity", info->identity},
                     {"fence", info->fence},
                     {"since", iso_time(info->since)},
                     {"expires_in_ms", info->expires_in.count()},
                     {"holder", info->holder_host + ":" + std::to_string(info->holder_pid)}};
    std::cout << j.dump(2) << "\n";
    return info ? exit_ok : exit_not_found;
  }
  if (!info) {
    std::cerr << "dblock leader: election '" << shown(l.name) << "' has no leader\n";
    return exit_not_found;
  }
  std::cout << "leader:     "
            << (info->identity.empty() ? "(not announced yet)" : shown(info->identity)) << "\n"
            << "fence:      " << info->fence << "\n"
            << "since:      " << iso_time(info->since) << "\n"
            << "expires in: " << info->expires_in.count() << " ms (renewed while it leads)\n"
            << "holder:     " << shown(info->holder_host) << ":" << info->holder_pid << "\n";
  return exit_ok;
}

}  // namespace dblock::cli
