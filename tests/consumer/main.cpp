#include <soci/soci.h>
#include <dblock/dblock.hpp>

#include <iostream>

// Takes a lease and runs SQL of its own through SOCI inside fenced(): the program uses
// SOCI's core directly, as users of session() and fenced() do, so its link needs it.
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  dblock::database db(argv[1]);
  dblock::migrate(db);
  dblock::lease_lock lock(db, "consumer");
  auto g = lock.try_acquire();
  if (!g) return 1;
  int one = 0;
  g->fenced([&](soci::session& sql) { sql << "SELECT 1", soci::into(one); });
  if (one != 1) return 1;
  std::cout << "consumer fence " << g->fence() << "\n";
  return 0;
}
