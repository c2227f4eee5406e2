// Internal: what dblock keeps beside one pooled connection (part of the dialect's interface,
// dialect.hpp): the server session, the server's product, version and flavor, and per-connection
// state of the storage layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dialect/capabilities.hpp"
#include "dialect/session_state.hpp"

#include <soci/soci-backend.h>  // soci::data_type

namespace dblock::detail {

/// A server session, as recorded when its connection was opened.
struct session_ref {
  std::int64_t id = 0;  ///< 0: no server session (SQLite)
  std::string tag;      ///< tells it apart from a later session reusing the id
};

/// State dblock keeps beside one pooled connection for the life of that connection (prepared
/// statements, the server session). Owned by the pool slot; destroyed before the connection
/// closes or reconnects. Each backend derives its own.
struct connection_state {
  virtual ~connection_state() = default;
  session_ref server;
  /// Behind a transaction-mode pooler: nothing on the server outlives a transaction.
  bool transaction_pooler = false;
  /// The least fence a lease acquire on this connection grants (lock_table::fence_floor()),
  /// once known; session: what session leases keep here.
  std::optional<std::int64_t> fence_floor;
  session_lease_state session;
  /// The time the server's cluster takes to drop a lost node and go on, when the server says
  /// (a Galera node: evs.suspect_timeout plus the view change), and whence it comes; zero: it
  /// does not say (database_options::failover_window, database::failover()).
  std::chrono::milliseconds failure_detection{0};
  std::string failure_detection_source;
  /// The server as it names itself when the connection opens (database::server()): product
  /// ("PostgreSQL", "MariaDB", "MySQL", "SQLite") and version; and which flavor of its dialect
  /// it speaks (capabilities.hpp), read once and kept for the connection's life.
  std::string product, version;
  flavor dialect_flavor = flavor::standard;
  /// The deadline of the call using the connection now (storage/deadline.hpp), when dblock's
  /// own: a dialect may hand it to the server as well (PostgreSQL: statement_timeout with BEGIN).
  std::optional<std::chrono::steady_clock::time_point> call_deadline;
  /// Row-returning caller statements (values.hpp fetch_rows()) by text: their columns' names
  /// and types as SOCI described them on their first run here, at most caller_statement_cache.
  struct caller_shape {
    std::vector<std::string> names;
    std::vector<soci::data_type> types;
  };
  std::map<std::string, caller_shape> caller_shapes;
};

}  // namespace dblock::detail
