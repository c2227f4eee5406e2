#include "dblock/database.hpp"

#include <soci/soci.h>

#include "database_impl.hpp"
#include "dialect/dialect.hpp"
#include "url.hpp"

namespace dblock {
namespace detail {

std::unique_ptr<pooled_session> database_impl::lease(const std::shared_ptr<database_impl>& self) {
  std::size_t pos = 0;
  auto wait_ms = static_cast<int>(std::min<long long>(options.pool_wait.count(), 1LL << 30));
  if (!pool.try_lease(pos, wait_ms))
    throw error(errc::timeout, "no pooled connection to " + redacted_url + " became free within " +
                                   std::to_string(options.pool_wait.count()) + " ms (pool_size " +
                                   std::to_string(options.pool_size) + ")");
  auto s = std::make_unique<pooled_session>(self, pos);
  if (!opened[pos]) {
    soci::session& sql = s->sql();
    try {
      attach_state(sql, nullptr);
      if (sql.get_backend() != nullptr) sql.close();
      sql.open(dia->factory(), connect_string);
      dia->on_connect(sql, options);
      auto state = dia->make_connection_state(sql);
      if (state) dia->identify_session(sql, *state);
      attach_state(sql, std::move(state));
      auto iso = dia->isolation_sql(options.isolation);
      if (!iso.empty()) sql << iso;
    } catch (...) {
      error e = dia->classify_current("connect");
      attach_state(sql, nullptr);
      try {
        sql.close();
      } catch (...) {
      }
      throw error(errc::connection_failed,
                  "cannot connect to " + redacted_url + ": " +
                      std::string(e.what()).substr(std::string("connect: ").size()),
                  backend, e.sqlstate(), e.native_code());
    }
    opened[pos] = 1;
  }
  return s;
}

database_impl::~database_impl() {
  for (std::size_t i = 0; i < opened.size(); ++i)
    attach_state(pool.at(i), nullptr);
}

bool end_broken_session(const std::shared_ptr<database_impl>& db, const session_ref& s) {
  try {
    return with_session(db, "end a broken session", [&](soci::session& sql) {
      return db->dia->end_session(sql, s, std::chrono::milliseconds(5000));
    });
  } catch (const error&) {
    return false;
  }
}

std::string in_doubt_finality(const std::shared_ptr<database_impl>& db, const session_ref& s) {
  if (end_broken_session(db, s))
    return "; the server session has been ended, so reading the data back now gives the final "
           "outcome";
  return "; the server session could not be confirmed ended, so its COMMIT may still land "
         "later";
}

error database_impl::failure(const std::string& what, pooled_session* s) const {
  error e = dia->classify_current(what);
  if (e.code() == errc::connection_lost && s) s->broken = true;
  if (e.code() == errc::schema_missing)
    return error(e.code(),
                 std::string(e.what()) + " (dblock's tables are missing in " + redacted_url +
                     ": run `dblock migrate --url URL`" +
                     (tables.prefix.empty() ? "" : " --table-prefix " + tables.prefix) + ")",
                 e.backend(), e.sqlstate(), e.native_code());
  return e;
}

pooled_session::~pooled_session() {
  if (!broken && db->opened[pos]) {
    // Never hand the next user a connection inside someone else's transaction (a caller's own
    // database::connection returned mid-transaction): roll it back, or drop the connection.
    try {
      soci::session& sql = db->pool.at(pos);
      if (db->dia->in_transaction(sql)) sql << "ROLLBACK";
    } catch (...) {
      broken = true;
    }
  }
  if (broken) {
    // Reconnect on the next lease instead of handing out a dead connection.
    db->opened[pos] = 0;
    try {
      attach_state(db->pool.at(pos), nullptr);
      db->pool.at(pos).close();
    } catch (...) {
    }
  }
  db->pool.give_back(pos);
}

}  // namespace detail

database::database(const std::string& url, database_options options) {
  auto parsed = detail::parse_url(url);
  const auto& dia = detail::dialect_for_scheme(parsed.scheme);
  if (options.pool_size == 0 || options.pool_size > 1024)
    throw error(errc::invalid_argument, "database_options.pool_size must be 1..1024");
  dia.adjust_options(parsed, options);
  auto impl = std::make_shared<detail::database_impl>(options.pool_size);
  impl->backend = dia.name();
  impl->redacted_url = parsed.redacted;
  impl->connect_string = dia.connect_string(parsed, options);
  impl->options = options;
  impl->dia = &dia;
  impl->tables = detail::make_table_names(options.table_prefix);
  impl_ = std::move(impl);
}

database::~database() = default;

const std::string& database::backend() const noexcept {
  return impl_->backend;
}
const std::string& database::redacted_url() const noexcept {
  return impl_->redacted_url;
}
const database_options& database::options() const noexcept {
  return impl_->options;
}
const std::string& database::lock_table() const noexcept {
  return impl_->tables.lock;
}

void database::ping() const {
  detail::with_session(impl_, "ping", [](soci::session& sql) {
    int one = 0;
    sql << "SELECT 1", soci::into(one);
  });
}

database::connection::connection(std::unique_ptr<detail::pooled_session> s) : s_(std::move(s)) {}
database::connection::connection(connection&&) noexcept = default;
database::connection& database::connection::operator=(connection&&) noexcept = default;
database::connection::~connection() = default;
soci::session& database::connection::session() {
  return s_->sql();
}
void database::connection::discard() noexcept {
  if (s_) s_->broken = true;
}

database::connection database::connect() const {
  return connection(impl_->lease(impl_));
}

}  // namespace dblock
