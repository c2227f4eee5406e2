// The cache rebuild example on every backend: with the read-write lock no reader sees a
// half-rebuilt cache and every rebuild runs; without it (the negative control) readers do.
#include <string>

#include "harness.hpp"
#include "run_program.hpp"

DBLOCK_TEST("example cache_rebuild: no reader sees a half-rebuilt cache", "[examples][rwlock]") {
  const std::string prefix = ctx.prefix + "cr_";
  ctx.prefixes.push_back(prefix);  // the harness drops dblock's tables of this prefix
  struct drop {
    const dblock::test::context& ctx;
    std::string prefix;
    ~drop() {
      if (ctx.backend == "sqlite") return;
      try {
        ctx.exec("DROP TABLE IF EXISTS " + prefix + "cache");
      } catch (...) {
      }
    }
  } dropper{ctx, prefix};
  const std::string cmd = std::string(DBLOCK_EXAMPLES_BIN) + "/cache_rebuild/cache_rebuild --url " +
                          dblock::test::shell_quote(ctx.url) + " --table-prefix " + prefix +
                          " --readers 4 --rows 20";
  {
    auto r = dblock::test::run_program(cmd + " --rebuilds 4 --reads 30");
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(r.output.find("mixed reads 0, rebuilds 4 of 4") != std::string::npos);
    CHECK(r.output.find("verdict: invariant held") != std::string::npos);
  }
  {
    auto r = dblock::test::run_program(cmd + " --rebuilds 4 --reads 60 --no-lock");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("invariant BROKEN") != std::string::npos);
  }
}
