// The cache rebuild example on every backend: with the read-write lock no reader sees a
// half-rebuilt cache and every rebuild runs; without it (the negative control) readers do.
#include <string>

#include "harness.hpp"
#include "run_program.hpp"

DBLOCK_TEST("example cache_rebuild: no reader sees a half-rebuilt cache", "[examples][rwlock]") {
  const dblock::test::example_run ex(ctx, "cache_rebuild", "cr_", {"cache"},
                                     "--readers 4 --rows 20");
  dblock::test::check_run(ex.cmd + " --rebuilds 4 --reads 30", 0, [](const auto& r) {
    CHECK(r.output.find("mixed reads 0, rebuilds 4 of 4") != std::string::npos);
    CHECK(r.output.find("verdict: invariant held") != std::string::npos);
  });
  dblock::test::check_run(ex.cmd + " --rebuilds 4 --reads 60 --no-lock", 1, [](const auto& r) {
    CHECK(r.output.find("invariant BROKEN") != std::string::npos);
  });
}
