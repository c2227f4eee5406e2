#include <prometheus/registry.h>
#include <dblock/dblock.hpp>
#include <dblock/prometheus.hpp>

#include <iostream>
#include <memory>
#include <sstream>
#include <string>

// Acquires and releases a lease with a prometheus_listener attached; prints the
// dblock_acquired_total sample.
int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto registry = std::make_shared<prometheus::Registry>();
  auto metrics =
      std::make_shared<dblock::prometheus_listener>(registry);  // backend="sqlite", from the URL
  dblock::database_options options;
  options.events = metrics;
  dblock::database db(argv[1], options);
  dblock::migrate(db);
  dblock::lease_lock lock(db, "consumer_prometheus");
  if (!lock.try_acquire()) return 1;
  std::istringstream text(metrics->text());
  for (std::string line; std::getline(text, line);) {
    if (line.rfind("dblock_acquired_total{", 0) == 0) std::cout << line << "\n";
  }
  return 0;
}
