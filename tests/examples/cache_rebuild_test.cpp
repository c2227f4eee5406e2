// The cache rebuild example on every backend: with the read-write lock no reader sees a
// half-rebuilt cache and every rebuild runs; without it (the negative control) readers do.
#include <string>

#include "harness.hpp"
#include "run_program.hpp"

DBLOCK_TEST("example cache_rebuild: no reader sees a half-rebuilt cache", "[examples][rwlock]") {
  const dblock::test::example_run ex(ctx, "cache_rebuild", "cr_", {"cache"},
                                     "--readers 4 --rows 20");
  {
    auto r = dblock::test::run_program(ex.cmd + " --rebuilds 4 --reads 30");
    INFO(r.output);
    CHECK(r.status == 0);
    CHECK(r.output.find("mixed reads 0, rebuilds 4 of 4") != std::string::npos);
    CHECK(r.output.find("verdict: invariant held") != std::string::npos);
  }
  {
    auto r = dblock::test::run_program(ex.cmd + " --rebuilds 4 --reads 60 --no-lock");
    INFO(r.output);
    CHECK(r.status == 1);
    CHECK(r.output.find("invariant BROKEN") != std::string::npos);
  }
}
