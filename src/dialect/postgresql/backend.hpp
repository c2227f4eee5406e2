// Internal: PostgreSQL's roles (see dialect.hpp). clock_timestamp() as the clock, INSERT ... ON
// CONFLICT ... RETURNING for acquire, SQLSTATE-based classification, statements prepared once per
// connection with libpq (PQprepare / PQexecPrepared: one round trip each, no re-parse).
#pragma once

#include <libpq-fe.h>
#include <soci/postgresql/soci-postgresql.h>
#include <soci/soci.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "dialect/common.hpp"
#include "dialect/dialect.hpp"

namespace dblock::detail::pg {

/// FNV-1a of `text` as 16 hex digits (names of prepared statements and pooler routines).
std::string hash_hex(const std::string& text);
/// The name a dblock statement is prepared under on a connection: dblock_<key>_<hash of its
/// text>, so that two table prefixes or dblock versions never share one (a fault test's proxy
/// finds a statement's Bind message by it).
std::string prepared_name(const statement& st);

/// Per connection: the statements prepared on it.
struct state final : connection_state {
  std::set<std::string> prepared;
  /// Caller statements (statement::caller): text -> the name it is prepared under.
  std::map<std::string, std::string> caller_names;
  /// Behind a transaction pooler: the server refused to create dblock's temporary routines (no
  /// TEMP privilege); routine statements run as unnamed statements.
  bool routines_refused = false;
  /// A WARNING (SQLSTATE 01000) arrived: how PostgreSQL answers a COMMIT whose wait for a
  /// synchronous standby was cancelled ("committed locally, but might not have been
  /// replicated"); read and cleared by connector::commit_unreplicated().
  mutable bool warned = false;
  /// The connection goes through a transaction-mode pooler (database_options::pooler).
  bool pooled = false;
};

inline PGconn* raw(soci::session& sql) {
  return static_cast<soci::postgresql_session_backend*>(sql.get_backend())->conn_;
}

/// Throws what SOCI would throw for failed result `r` (or for the connection's error when `r`
/// is null), so that the classifier treats libpq and SOCI paths alike; clears `r`.
[[noreturn]] void fail(PGconn* c, PGresult* r);
/// Runs a command without parameters or rows through libpq (no SOCI statement object); throws
/// as fail().
void command(PGconn* c, const std::string& sql);

class connector final : public detail::connector {
 public:
  std::unique_ptr<interrupter> interrupter_for(soci::session&,
                                               const connection_state&) const override;
  std::string bounded_connect(const std::string& connect_string,
                              std::chrono::milliseconds left) const override;
  const soci::backend_factory& factory() const override { return *soci::factory_postgresql(); }
  void adjust_options(const parsed_url& u, database_options& o) const override;
  std::string connect_string(const parsed_url& u, const database_options& o) const override;
  std::unique_ptr<connection_state> on_connect(soci::session&,
                                               const database_options&) const override;
  std::string isolation_sql(isolation_level level) const override;
  bool end_session(soci::session&, const session_ref& s,
                   std::chrono::milliseconds timeout) const override;
  void begin(soci::session&, const connection_state& st, const database_options& o,
             std::optional<std::chrono::milliseconds> lock_timeout) const override;
  void commit(soci::session&, const connection_state& st) const override;
  void set_lock_timeout(soci::session&, const connection_state&,
                        std::chrono::milliseconds) const override;
  // ON CONFLICT DO NOTHING never waits for a holder of the existing row (and a session-level
  // lock_timeout would outlive the call).
  bool in_transaction(soci::session&) const override;
  bool commit_unreplicated(connection_state& st) const override;
  bool transaction_failed(soci::session&) const override;
  bool has_unique_index(soci::session&, const std::string& table,
                        const std::string& column) const override;
  bool table_exists(soci::session&, const std::string& table) const override;
  void lock_migrations(soci::session&, const connection_state& st,
                       const std::string& key) const override;
  bool session_migration_lock(const connection_state& st) const override {
    return !st.transaction_pooler;
  }
  void lock_migrations_in_transaction(soci::session&, const std::string& key) const override;
  void unlock_migrations(soci::session&, const std::string& key) const override;
};

/// LISTEN/NOTIFY wake-ups while a handle has waiters (doorbell.cpp).
/// The wake-up listener's connection helpers (doorbell.cpp), shared by the channel of one
/// handle and the host relay (relay.cpp); failures are logged through `log`, not thrown.
struct listen_link {
  std::string conninfo;
  std::function<void(const std::string&)> log;
  /// A new connection, or nullptr (logged: waiters poll meanwhile).
  PGconn* connect() const;
  /// Runs `sql`; false (logged) when it failed and the caller should reconnect.
  bool command(PGconn* c, const std::string& sql) const;
};
/// What the two PostgreSQL wake-up channels share (doorbell.cpp: a listener per handle;
/// relay.cpp: one per host): the callbacks, the listener connection, the handle's waiters and
/// the channel's thread, which runs run() until the channel is destroyed.
class listening_channel : public bell_channel {
 public:
  bool live() const override { return live_.load(); }
  bool addressed() const override { return true; }
  // The release looks up the head of the queue as of its statement's start: a release that
  // began before a new waiter's entry was committed, and commits after that waiter's first
  // read, rings nobody for it. It commits within milliseconds; one more read then finds it.
  std::chrono::milliseconds joined_recheck() const override {
    return std::chrono::milliseconds(10);
  }
  void watch(const std::string& token, bool on) override;

 protected:
  /// `what` names the channel in log messages.
  listening_channel(std::string conninfo, bell_callbacks cb, std::string what);
  /// Starts run() on the channel's thread: the last step of the derived constructor.
  void start();
  /// Stops and joins the thread: the first step of the derived destructor.
  void stop();
  virtual void run() = 0;
  void log(const std::string& m) const;
  bool wanted() const { return watched_.any(); }

  const std::string what_;
  bell_callbacks cb_;
  const listen_link link_;
  poke_fd poke_;
  watched_waiters watched_;
  std::atomic<bool> stop_{false}, live_{false};

 private:
  std::thread thread_;
};

/// Parses a release's NOTIFY payload "<fence>:<head token>[@<handle>]:<name>" (the name may
/// contain ':'): `handle` is the part of the head's bell after the host relay's (empty for a
/// bell of one handle). False when it is not such a payload.
bool parse_ring_payload(const std::string& payload, ring_event& ev, std::string& handle);
/// The LISTEN channel of a bell: dblock_w_<bell>.
std::string bell_listen(const std::string& bell);
/// The host relay's channel (relay.cpp) for the handles of this host that connect with
/// `conninfo`; nullptr when its directory cannot be used (the handle then listens alone).
std::unique_ptr<bell_channel> open_relay(const std::string& conninfo, bell_callbacks& cb);
/// The host bell of the relay directory of `conninfo` (made when missing); empty when there is
/// no usable directory.
std::string relay_host_bell(const std::string& conninfo);
/// Rings handle `handle` (its 15 hex digits as a number) of the host relay of `conninfo` through
/// its directory, for the lease of `name` freed at `fence`; false when it could not (no such
/// handle directory: that handle has no waiters any more). `granted_ticket` > 0: the lease was
/// handed to that handle's waiter with this ticket, at `fence`.
bool ring_relay_handle(const std::string& conninfo, const std::string& name, std::int64_t fence,
                       std::int64_t handle, std::int64_t granted_ticket);

class doorbell final : public detail::doorbell {
 public:
  std::string target(const parsed_url& u, const database_options& o) const override;
  std::unique_ptr<bell_channel> open(const std::string& target, const table_names& t,
                                     bell_callbacks cb) const override;
  std::string relay_bell(const std::string& target) const override;
  bool ring_handle(const std::string& target, const std::string& name, std::int64_t fence,
                   std::int64_t handle, std::int64_t granted_ticket) const override;
};

class classifier final : public detail::classifier {
 public:
  error classify_current(const std::string& what) const override;
};

class vocabulary final : public detail::vocabulary {
 public:
  capabilities can() const override {
    capabilities c;
    c.ring = release_ring::notify;
    c.hand_over = handover::in_release;
    c.exit = queue_exit::in_acquire;
    c.skip_locked = true;
    c.durability_per_table = true;
    c.durable_commit = true;
    c.session_leases = true;
    c.pooler = true;
    c.insert_if_absent_waits = false;
    c.reap_in_key_order = true;
    return c;
  }
  fence_check check_fence_native(const table_names& t) const override;
  std::string now() const override { return "clock_timestamp()"; }
  std::string plus_us(const std::string& ts, const std::string& param) const override {
    return "(" + ts + " + CAST(:" + param + " AS DOUBLE PRECISION) * INTERVAL '1 microsecond')";
  }
  std::string epoch_us(const std::string& ts) const override {
    return "CAST(floor(extract(epoch FROM " + ts + ") * 1000000) AS BIGINT)";
  }
  std::string lease_acquire(const table_names& t, bool in_queue_order) const override;
  std::string lease_acquire_dequeue(const table_names& t, bool in_queue_order) const override;
  std::string id_reserve(const table_names& t) const override;
  std::string release_returning(const table_names& t, bool forced) const override;
  std::string lease_release_granting(const table_names& t) const override;
  std::string head_notify(const table_names& t) const override;
  std::string queue_ring_all(const table_names& t) const override;
  std::string returning_unflushed(const std::string& column) const override {
    // set_config(..., true) lasts until the end of this statement's own transaction.
    return " RETURNING " + column + " + 0 * length(set_config('synchronous_commit', 'off', true))";
  }
  std::string lock_table_durable() const override {
    return "SELECT CASE WHEN c.relpersistence = 'u' THEN 0 ELSE 1 END FROM pg_catalog.pg_class c"
           " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
           " WHERE n.nspname = current_schema() AND c.relname = :table";
  }
  std::string set_lock_table_durability(const table_names& t, bool fast) const override {
    return "ALTER TABLE " + t.lock + (fast ? " SET UNLOGGED" : " SET LOGGED");
  }
  // remote_apply: with a synchronous standby, the epoch is on it before any fence of the epoch
  // is granted; without one it is a local flush.
  std::string durable_commit() const override {
    return "SET LOCAL synchronous_commit = remote_apply";
  }
  session_texts session_leases(const table_names& t) const override;
  std::string bytewise(const std::string& column) const override {
    return column + " COLLATE \"C\"";
  }

 private:
  /// release_returning()'s value for the release's new row `row` ("<table>." or "l."), ringing
  /// the head of `queue` (an SQL expression; empty: the row's own name).
  std::string freed_ring(const table_names& t, const std::string& row,
                         const std::string& queue = std::string()) const;
};

/// Behind a transaction-mode pooler, a statement::routine statement runs as a PL/pgSQL routine
/// in the server session's temporary schema (see executor.cpp).
struct routine {
  std::string create;         ///< CREATE OR REPLACE FUNCTION pg_temp.dblock_<key>_<hash>(...)
  std::string call;           ///< a simple query calling it, the values as typed literals
  bool returns_rows = false;  ///< rows of one BIGINT; otherwise one row: the rows affected
};
/// The routine of `positional` (the statement with $n parameters) for these values' types.
routine make_routine(PGconn* c, const std::string& key, const std::string& positional,
                     const std::vector<sql_param>& values);
/// True when a routine's call failed because the routine is missing on this server session
/// (nothing ran): run `create` and `call` together in one simple query.
bool routine_missing(PGresult* r);

class executor final : public detail::executor {
 public:
  sql_result run(exec_session&, const statement& st,
                 const std::vector<sql_param>& values) const override;

 private:
  sql_result run_routine(PGconn* c, state& cs, const statement& st,
                         const std::vector<sql_param>& values,
                         const std::vector<const char*>& ptrs) const;
};

}  // namespace dblock::detail::pg
