// dblock id: print IDs of a database-backed ID generator (dblock::id_generator), one per line.
#include <algorithm>
#include <iostream>
#include <string>

#include "commands.hpp"

namespace dblock::cli {

CLI::App* add_id(CLI::App& app, common_options& common, id_options& i) {
  auto* id = app.add_subcommand(
      "id", "print unique 63-bit IDs from a database-backed ID generator, one per line");
  add_common(id, common);
  id->add_option("--name", i.name, "generator name (1..255 bytes of UTF-8)")->capture_default_str();
  id->add_option("--count", i.count, "how many IDs to print (1..100000000)")
      ->check(CLI::Range(1LL, 100000000LL))
      ->capture_default_str();
  id->add_option("--block-size", i.block_size,
                 "IDs reserved per block (1..4194304; default: --count, at most 1000)")
      ->check(CLI::Range(1LL, static_cast<long long>(dblock::id_generator::per_ms)));
  return id;
}

int run_id(const common_options& c, const id_options& i) {
  auto db = open_db(c);
  dblock::id_generator_options o;
  // A one-shot command: do not reserve (and waste) more IDs than it prints, unless asked to.
  o.block_size = i.block_size > 0 ? i.block_size : std::min<long long>(i.count, 1000);
  o.prefetch = i.count > o.block_size;
  dblock::id_generator gen(db, i.name, o);
  std::string out;
  out.reserve(1 << 16);
  for (long long k = 0; k < i.count; ++k) {
    out += std::to_string(gen.next());
    out += '\n';
    if (out.size() >= (1 << 16) - 32) {
      std::cout << out << std::flush;
      out.clear();
    }
  }
  std::cout << out << std::flush;
  if (c.verbose) {
    auto s = gen.stats();
    std::cerr << "dblock id: " << s.ids_issued << " IDs from " << s.blocks_reserved << " blocks in "
              << s.reservations << " reservations\n";
  }
  return std::cout ? exit_ok : exit_software;
}

}  // namespace dblock::cli
