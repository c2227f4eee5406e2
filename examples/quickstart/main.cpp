// dblock's quick start: migrate an SQLite file in the current directory, take a lease, print
// its fence, write under it, release. Run it twice: the fence grows.
#include <soci/soci.h>  // for your own SQL inside fenced()
#include <dblock/dblock.hpp>

#include <chrono>
#include <iostream>

int main() {
  try {
    dblock::database db("sqlite://quickstart.db");  // or postgresql://..., mysql://...
    dblock::migrate(db);                            // creates or upgrades dblock's tables
    auto conn = db.connect();                       // a pooled connection for your own SQL
    conn.session() << "CREATE TABLE IF NOT EXISTS report_run (fence BIGINT NOT NULL)";

    dblock::lease_options options;
    options.ttl = std::chrono::seconds(30);  // judged by the database clock
    options.watchdog = true;                 // renewed at ttl/3 while we hold it
    dblock::lease_lock lock(db, "reports/daily", options);

    auto lease = lock.acquire(std::chrono::seconds(10));  // waits; errc::timeout if held
    const long long fence = lease.fence();                // grows with every acquisition
    std::cout << "fence " << fence << "\n";

    lease.fenced([&](soci::session& sql) {  // commits only while the lease is ours
      sql << "INSERT INTO report_run (fence) VALUES (:f)", soci::use(fence);
    });
    lease.release();
    return 0;
  } catch (const dblock::error& e) {
    std::cerr << "quickstart: " << e.what() << "\n";
    return 1;
  }
}
