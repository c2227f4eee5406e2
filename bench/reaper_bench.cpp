// Reaper throughput: inserts N long-expired lease rows, then times reap_once().
// Usage: dblock_reaper_bench URL [ROWS=100000] [BATCH=1000]
#include <soci/soci.h>
#include <dblock/dblock.hpp>

#include <chrono>
#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [ROWS] [BATCH]\n", argv[0]);
    return 2;
  }
  const int rows = argc > 2 ? std::stoi(argv[2]) : 100000;
  dblock::database_options o;
  o.table_prefix = "benchreap_";
  dblock::database db(argv[1], o);
  dblock::migrate(db);
  {
    // Fill through the library's own lease path is too slow for 100k rows; write the rows
    // directly, expired two hours ago by the database clock.
    auto c = db.connect();
    auto& sql = c.session();
    const std::string backend = db.backend();
    const std::string past = backend == "postgresql" ? "clock_timestamp() - INTERVAL '2 hours'"
                             : backend == "mysql"    ? "UTC_TIMESTAMP(6) - INTERVAL 2 HOUR"
                                                     : "0";
    const int chunk = 500;
    for (int base = 0; base < rows; base += chunk) {
      std::string q = "INSERT INTO " + db.lock_table() +
                      " (resource_name, owner_token, fence, hold_count, acquired_at, expires_at,"
                      " holder_host, holder_pid, holder_thread) VALUES ";
      for (int i = base; i < std::min(rows, base + chunk); ++i)
        q += std::string(i > base ? ", " : "") + "('bench-" + std::to_string(i) + "', '', " +
             std::to_string(i + 1) + ", 0, " + past + ", " + past + ", '', 0, '')";
      sql << (backend == "sqlite" ? "BEGIN IMMEDIATE" : "BEGIN");
      sql << q;
      sql << "COMMIT";
    }
  }
  dblock::reaper_options ro;
  ro.retention = std::chrono::hours(1);
  ro.floor_grace = std::chrono::milliseconds(0);
  ro.batch_size = argc > 3 ? std::stoul(argv[3]) : 1000;
  auto r = dblock::reap_once(db, ro);
  double secs = r.elapsed.count() / 1e6;
  std::printf("%-10s reaped %llu rows in %llu batches of %zu: %.2f s, %.0f rows/s\n",
              db.backend().c_str(), static_cast<unsigned long long>(r.rows_reaped),
              static_cast<unsigned long long>(r.batches), ro.batch_size, secs,
              r.rows_reaped / secs);
  return r.rows_reaped == static_cast<unsigned long long>(rows) ? 0 : 1;
}
