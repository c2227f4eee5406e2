#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>

#include "backend.hpp"
#include "dialect/common.hpp"

namespace dblock::detail::lite {
namespace {

void now_us_fn(sqlite3_context* ctx, int, sqlite3_value**) {
  auto now = std::chrono::system_clock::now().time_since_epoch();
  sqlite3_result_int64(ctx, std::chrono::duration_cast<std::chrono::microseconds>(now).count());
}

}  // namespace

std::string connector::connect_string(const parsed_url& u, const database_options&) const {
  check_query_keys(u, {"synchronous", "busy_timeout"});
  if (u.query.count("synchronous")) {
    const auto& v = u.query.at("synchronous");
    if (v != "full" && v != "normal" && v != "extra")
      throw error(errc::invalid_argument, "invalid database URL '" + u.redacted +
                                              "': synchronous must be full, normal or extra");
  }
  // SOCI's SQLite parser takes double quotes around values with spaces; a double quote in a
  // path cannot be expressed, so refuse it rather than open another file.
  if (u.path.find('"') != std::string::npos)
    throw error(errc::invalid_argument,
                "invalid database URL '" + u.redacted + "': the path contains '\"'");
  // sqlite::memory: is one database for every connection of this dblock::database: SQLite's
  // memdb VFS shares a name that begins with '/' among the connections of a process, with the
  // usual locking (busy waits, BEGIN IMMEDIATE), unlike ":memory:" (a database per connection)
  // or a shared cache (table locks that ignore the busy timeout). The name is new for every
  // handle, and keep_open() keeps it alive while the handle lives. (Debian's SQLite takes URI
  // file names: SQLITE_USE_URI.)
  if (u.memory) {
    static std::atomic<unsigned long long> handles{0};
    return "db=\"file:/dblock-memory-" + std::to_string(::getpid()) + "-" +
           std::to_string(++handles) + "?vfs=memdb\"" +
           (u.query.count("synchronous") ? " synchronous=" + u.query.at("synchronous") : "");
  }
  // A relative path that begins with white space: SOCI's parser would
  // index an empty string (out of bounds); "./" in front names the same file.
  const bool lead = !u.path.empty() && std::isspace(static_cast<unsigned char>(u.path[0]));
  return "db=\"" + std::string(lead ? "./" : "") + u.path + "\"" +
         (u.query.count("synchronous") ? " synchronous=" + u.query.at("synchronous") : "");
}

void connector::adjust_options(const parsed_url& u, database_options& o) const {
  if (u.query.count("busy_timeout")) {
    const auto& v = u.query.at("busy_timeout");
    if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string::npos)
      throw error(errc::invalid_argument,
                  "invalid database URL '" + u.redacted + "': busy_timeout must be milliseconds");
  }
  if (u.query.count("busy_timeout"))
    o.sqlite_busy_timeout = std::chrono::milliseconds(std::stoll(u.query.at("busy_timeout")));
}

std::shared_ptr<void> connector::keep_open(const std::vector<std::string>& connect_strings) const {
  const std::string& cs = connect_strings.at(0);
  const std::string head = "db=\"file:/dblock-memory-";
  if (cs.rfind(head, 0) != 0) return nullptr;
  const std::string name = cs.substr(4, cs.find('"', 4) - 4);
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      name.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI, nullptr);
  if (rc != SQLITE_OK) {
    const std::string why = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    throw error(errc::connection_failed, "could not open the in-memory database: " + why, "sqlite",
                "", rc);
  }
  return std::shared_ptr<void>(db, [](void* p) { sqlite3_close(static_cast<sqlite3*>(p)); });
}

// SQLite's own busy timeout, with one difference: a wait ends at once when the call's deadline
// cut the connection off (sqlite3_interrupt() does not end a busy wait). The same sleeps as
// SQLite's default handler.
static int busy_wait(void* arg, int count) {
  const auto& st = *static_cast<const state*>(arg);
  if (st.cut.load()) return 0;
  const auto now = std::chrono::steady_clock::now();
  if (count == 0) st.busy_since = now;
  const long long waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(now - st.busy_since).count();
  if (waited >= st.busy_ms) return 0;
  static const int delays[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};
  const long long d = std::min<long long>(count < 12 ? delays[count] : 100, st.busy_ms - waited);
  sqlite3_sleep(static_cast<int>(std::max<long long>(d, 1)));
  return 1;
}

std::unique_ptr<connection_state> connector::on_connect(soci::session& sql,
                                                        const database_options& o) const {
  sqlite3* db = raw(sql);
  sqlite3_extended_result_codes(db, 1);
  sqlite3_create_function(db, "dblock_now_us", 0, SQLITE_UTF8, nullptr, now_us_fn, nullptr,
                          nullptr);
  // The busy handler comes first: opening a database that another connection is checkpointing
  // (the last one to close a WAL database does) is SQLITE_BUSY on the first statement.
  auto st = std::make_unique<state>(db);
  st->busy_ms = o.sqlite_busy_timeout.count();
  sqlite3_busy_handler(db, busy_wait, st.get());
  std::string mode;
  sql << "PRAGMA journal_mode=WAL", soci::into(mode);
  sql << "PRAGMA synchronous", soci::into(st->synchronous);
  st->wal = mode == "wal";
  st->product = "SQLite";
  st->version = sqlite3_libversion();  // the library linked in: it is the database engine
  return st;
}

void connector::begin(soci::session& sql, const connection_state& st, const database_options&,
                      std::optional<std::chrono::milliseconds> lock_timeout) const {
  // The wait for SQLite's single write lock happens here, not at the row.
  if (lock_timeout) set_lock_timeout(sql, st, *lock_timeout);
  // Cached statements: parsing BEGIN and COMMIT anew was a measurable part of a short write.
  static_cast<const state&>(st).exec("begin", "BEGIN IMMEDIATE");
}

void connector::commit(soci::session&, const connection_state& st) const {
  static_cast<const state&>(st).exec("commit", "COMMIT");
}

void connector::set_lock_timeout(soci::session&, const connection_state& st,
                                 std::chrono::milliseconds ms) const {
  static_cast<const state&>(st).busy_ms = ms.count();
}

void connector::end_transaction(soci::session&, const connection_state& st,
                                const database_options& o) const {
  static_cast<const state&>(st).busy_ms = o.sqlite_busy_timeout.count();
}

bool connector::in_transaction(soci::session& sql) const {
  return sqlite3_get_autocommit(raw(sql)) == 0;
}

bool connector::has_unique_index(soci::session& sql, const std::string& table,
                                 const std::string& column) const {
  int n = 0;
  // A unique, non-partial index on exactly this column, or a one-column primary key.
  sql << "SELECT (SELECT count(*) FROM pragma_index_list(:t) il"
         " WHERE il.\"unique\" = 1 AND il.partial = 0"
         " AND (SELECT count(*) FROM pragma_index_info(il.name)) = 1"
         " AND (SELECT name FROM pragma_index_info(il.name)) = :c)"
         " + (SELECT count(*) FROM pragma_table_info(:t2) WHERE name = :c2 AND pk = 1"
         " AND (SELECT count(*) FROM pragma_table_info(:t3) WHERE pk > 0) = 1)",
      soci::use(table, "t"), soci::use(column, "c"), soci::use(table, "t2"),
      soci::use(column, "c2"), soci::use(table, "t3"), soci::into(n);
  return n > 0;
}

bool connector::table_exists(soci::session& sql, const std::string& table) const {
  int n = 0;
  sql << "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = :t", soci::use(table),
      soci::into(n);
  return n > 0;
}

}  // namespace dblock::detail::lite

namespace dblock::detail::lite {
namespace {
// No server and no socket: sqlite3_interrupt() ends the running statement, and the cut flag a
// busy wait (busy_wait()).
class interrupt final : public interrupter {
 public:
  interrupt(sqlite3* db, const state& st) : db_(db), st_(st) {}
  void cut() noexcept override {
    st_.cut.store(true);  // a busy wait ends at once (busy_wait())
    sqlite3_interrupt(db_);
  }

 private:
  sqlite3* db_;
  const state& st_;
};
}  // namespace

std::unique_ptr<interrupter> connector::interrupter_for(soci::session& sql,
                                                        const connection_state& st) const {
  const auto& s = static_cast<const state&>(st);
  s.cut.store(false);
  return std::make_unique<interrupt>(raw(sql), s);
}

}  // namespace dblock::detail::lite
