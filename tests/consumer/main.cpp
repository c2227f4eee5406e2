#include <dblock/dblock.hpp>

#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  dblock::database db(argv[1]);
  dblock::migrate(db);
  dblock::lease_lock lock(db, "consumer");
  auto g = lock.try_acquire();
  if (!g) return 1;
  std::cout << "consumer fence " << g->fence() << "\n";
  return 0;
}
