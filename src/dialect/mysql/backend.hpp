// Internal: MySQL / MariaDB's roles (see dialect.hpp). UTC_TIMESTAMP(6) as the clock (constant
// within a statement), INSERT ... ON DUPLICATE KEY UPDATE for acquire with the fence returned
// through LAST_INSERT_ID(expr) in the OK packet, errno-based classification, GET_LOCK around
// migrations, statements sent as one text query each (as SOCI's MySQL backend and the C client
// do: one round trip).
#pragma once

#include <soci/mysql/soci-mysql.h>
#include <soci/soci.h>

#include <string>

#include "dialect/dialect.hpp"

namespace dblock::detail::my {

/// Per connection: whether the server is a Galera (MariaDB Cluster) node.
struct state final : connection_state {
  bool galera = false;
  /// The session's innodb_lock_wait_timeout as dblock last set it: -1 the server's default,
  /// -2 unknown (a SET that failed). Kept across transactions (connector::begin()).
  mutable long long lock_wait_s = -1;
};

inline MYSQL* raw(soci::session& sql) {
  return static_cast<soci::mysql_session_backend*>(sql.get_backend())->conn_;
}

class connector final : public detail::connector {
 public:
  std::unique_ptr<interrupter> interrupter_for(soci::session&,
                                               const connection_state&) const override;
  std::string bounded_connect(const std::string& connect_string,
                              std::chrono::milliseconds left) const override;
  const soci::backend_factory& factory() const override { return *soci::factory_mysql(); }
  std::string connect_string(const parsed_url& u, const database_options& o) const override;
  void adjust_options(const parsed_url& u, database_options& o) const override;
  std::vector<std::string> connect_strings(const parsed_url& u,
                                           const database_options& o) const override;
  std::unique_ptr<connection_state> on_connect(soci::session&,
                                               const database_options&) const override;
  bool end_session(soci::session&, const session_ref& s,
                   std::chrono::milliseconds timeout) const override;
  void begin(soci::session&, const connection_state& st, const database_options& o,
             std::optional<std::chrono::milliseconds> lock_timeout) const override;
  void set_lock_timeout(soci::session&, const connection_state&,
                        std::chrono::milliseconds) const override;
  void to_session_defaults(soci::session&, const connection_state&) const override;
  bool in_transaction(soci::session&) const override;
  bool has_unique_index(soci::session&, const std::string& table,
                        const std::string& column) const override;
  bool table_exists(soci::session&, const std::string& table) const override;
  void lock_migrations(soci::session&, const connection_state&,
                       const std::string& key) const override;
  void unlock_migrations(soci::session&, const std::string& key) const override;
  const char* session_lease_refusal(const connection_state& st) const override;
  bool locks_by_writing(const connection_state& st) const override {
    return static_cast<const state&>(st).galera;
  }
};

/// Wake-ups through a sleeping connection that the releasing process interrupts (doorbell.cpp).
class doorbell final : public detail::doorbell {
 public:
  std::string target(const parsed_url& u, const database_options& o) const override;
  std::unique_ptr<bell_channel> open(const std::string& target, const table_names& t,
                                     bell_callbacks cb) const override;
};

/// The dblock::errc of a server or client error number (errno-based classification).
errc errc_of(unsigned errno_value);

class classifier final : public detail::classifier {
 public:
  error classify_current(const std::string& what) const override;
};

class vocabulary final : public detail::vocabulary {
 public:
  capabilities can() const override {
    capabilities c;
    c.ring = release_ring::interrupt;
    c.hand_over = handover::none;
    c.exit = queue_exit::deferred;
    c.skip_locked = true;
    c.session_leases = true;
    c.session_idle_whole_seconds = true;
    return c;
  }
  fence_check check_fence_native(const table_names& t) const override;
  std::string lock_by_writing(const table_names& t, const std::string& where) const override;
  session_texts session_leases(const table_names& t) const override;
  std::string flavor_name(flavor f) const override {
    return f == flavor::mysql ? "MySQL 8" : "MariaDB";
  }
  std::string no_fast_leases() const override {
    return "MySQL and MariaDB flush the log at commit for the whole server "
           "(innodb_flush_log_at_trx_commit is a global setting), so one lock table cannot skip "
           "the flush";
  }
  std::string quote(std::string_view ident) const override {
    return "`" + std::string(ident) + "`";
  }
  // Names are VARBINARY, where LIKE's '_' matches one byte; compare as UTF-8 text, exactly, so
  // that '?' matches one character like on the other backends.
  std::string name_pattern(const std::string& column, const std::string& param) const override {
    return "CONVERT(" + column + " USING utf8mb4) COLLATE utf8mb4_bin LIKE :" + param +
           " ESCAPE '!'";
  }
  std::string now() const override { return "UTC_TIMESTAMP(6)"; }
  // DDL commits by itself: no transaction around a printed migration file.
  std::string script_begin() const override { return ""; }
  std::string script_commit() const override { return ""; }
  std::string script_statement(const std::string& st) const override {
    if (st.rfind("CREATE PROCEDURE", 0) != 0 && st.rfind("CREATE FUNCTION", 0) != 0)
      return st + ";\n";
    return "DELIMITER //\n" + st + "//\nDELIMITER ;\n";  // the mysql client's own splitting
  }
  std::string plus_us(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + INTERVAL :" + param + " MICROSECOND)";
  }
  std::string epoch_us(const std::string& ts) const override {
    return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + ts + ")";
  }
  // Not INSERT IGNORE: it would turn real errors (a too-long value) into warnings.
  std::string by_primary_key() const override { return " FORCE INDEX (PRIMARY)"; }
  std::string insert_if_absent(const std::string& key) const override {
    return " ON DUPLICATE KEY UPDATE " + key + " = " + key;
  }
  std::string lease_acquire(const table_names& t, bool in_queue_order) const override;
  std::string returning(const std::string&) const override { return {}; }
  std::string id_reserve(const table_names& t) const override;
  std::string release_head(const table_names& t) const override;
  std::string head_sleeper(const table_names& t) const override;
  std::string queue_ring_all(const table_names& t) const override;
  std::string bell_ring() const override { return "KILL QUERY :id"; }
};

/// What a handle's wake-up connection runs while its waiters wait (doorbell.cpp):
/// bell_sleep_prefix + its 32-character bell + bell_sleep_suffix.
inline const std::string bell_sleep_prefix = "SELECT SLEEP(2) /* dblock-bell ";
inline const std::string bell_sleep_suffix = " */";
/// The user-level lock (GET_LOCK) a wake-up connection holds for its life: bell_lock_prefix +
/// its bell (44 characters, under MySQL's 64). vocabulary::release_head() finds the connection
/// with IS_USED_LOCK(), so it never names anything else.
inline const std::string bell_lock_prefix = "dblock-bell-";

/// Sets the session's innodb_lock_wait_timeout to `seconds` (-1: the server's default) unless
/// state::lock_wait_s says it has it already (connector.cpp).
void set_lock_wait(soci::session& sql, const connection_state& st, long long seconds);

class executor final : public detail::executor {
 public:
  sql_result run(exec_session&, const statement& st,
                 const std::vector<sql_param>& values) const override;
  /// Outside a transaction, gives the session the server's lock wait back (set_lock_wait()).
  void begin_statement(exec_session&, bool no_flush_wait) const override;
};

}  // namespace dblock::detail::my
