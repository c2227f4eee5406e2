// Smoke demo: migrate a database, take a lease lock, print its fencing token, release it.
// Usage: dblock_smoke [URL]   (default: sqlite://dblock-demo.db)
#include <dblock/dblock.hpp>

#include <iostream>

int main(int argc, char** argv) {
  const std::string url = argc > 1 ? argv[1] : "sqlite://dblock-demo.db";
  try {
    dblock::database db(url);
    auto migrated = dblock::migrate(db);
    std::cout << "database      " << db.redacted_url() << " (" << db.backend() << ")\n"
              << "migrations    " << migrated.applied_now.size() << " applied now, "
              << migrated.files.size() << " in total\n";

    dblock::lease_options options;
    options.ttl = std::chrono::seconds(10);
    dblock::lease_lock lock(db, "demo/nightly-report", options);
    for (int round = 1; round <= 3; ++round) {
      auto guard = lock.try_acquire();
      if (!guard) {
        std::cout << "round " << round << "       lock is held by someone else\n";
        return 75;
      }
      std::cout << "round " << round << "       acquired '" << guard->name() << "' fence "
                << guard->fence() << ", valid for " << guard->remaining().count() << " ms\n";
      guard->release();
    }
    std::cout << "released      fences only grow: run me again and they continue\n";
    return 0;
  } catch (const dblock::error& e) {
    std::cerr << "dblock_smoke: " << e.what() << "\n";
    return 1;
  }
}
