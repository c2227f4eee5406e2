#include <utility>

#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::my {

errc errc_of(unsigned n) {
  static const std::pair<unsigned, errc> table[] = {
      {1062, errc::unique_violation},
      {1213, errc::deadlock},         // also a Galera certification failure: rolled back, retryable
      {1047, errc::connection_lost},  // Galera: node not ready (left the primary component)
      {1020, errc::serialization_failure},  // MariaDB: record changed since last read
      {1205, errc::lock_not_available},     // lock wait timeout (also MariaDB's NOWAIT)
      {3572, errc::lock_not_available},     // MySQL 8 NOWAIT
      {2006, errc::connection_lost},        // server has gone away
      {2013, errc::connection_lost},        // lost connection during query
      {2055, errc::connection_lost},        // lost connection (system error)
      {1927, errc::connection_lost},        // MariaDB: connection was killed
      {1053, errc::connection_lost},        // server shutdown in progress
      {4031, errc::connection_lost},        // MySQL 8: disconnected by the server
      {1290, errc::connection_failed},      // --read-only: nothing written; reconnect (a failover)
      {1836, errc::connection_failed},      // read-only mode
      {1792, errc::connection_failed},      // a read-only transaction
      {1045, errc::connection_failed},
      {1044, errc::connection_failed},
      {1049, errc::connection_failed},
      {2002, errc::connection_failed},
      {2003, errc::connection_failed},
      {2005, errc::connection_failed},
      {1146, errc::schema_missing},
      {1406, errc::invalid_argument},
      {1969, errc::timeout},  // MariaDB max_statement_time
      {3024, errc::timeout},  // MySQL max_execution_time
  };
  for (const auto& entry : table)
    if (entry.first == n) return entry.second;
  return errc::backend_error;
}

error classifier::classify_current(const std::string& what) const {
  rethrow_if_dblock_error();
  try {
    throw;
  } catch (const soci::mysql_soci_error& e) {
    const unsigned n = e.err_num_;
    return error(errc_of(n), what + ": " + one_line(e.get_error_message()), "mysql", "",
                 static_cast<long long>(n));
  } catch (const soci::soci_error& e) {
    errc code = e.get_error_category() == soci::soci_error::connection_error ? errc::connection_lost
                                                                             : errc::backend_error;
    return error(code, what + ": " + one_line(e.get_error_message()), "mysql", "", 0);
  } catch (const std::exception& e) {
    return error(errc::backend_error, what + ": " + one_line(e.what()), "mysql", "", 0);
  }
}

}  // namespace dblock::detail::my
