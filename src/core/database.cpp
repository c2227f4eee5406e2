#include "dblock/database.hpp"

#include "dblock/migrate.hpp"
#include "dblock/version.hpp"

#include <soci/soci.h>

#include "core/url.hpp"
#include "storage/session.hpp"
#include "storage/statements.hpp"
#include "wake/hub.hpp"

namespace dblock {

const char* version() noexcept {
  return DBLOCK_VERSION_STRING;
}

database::database(const std::string& url, database_options options) {
  auto parsed = detail::parse_url(url);
  const auto& dia = detail::dialect_for_scheme(parsed.scheme);
  if (auto it = parsed.query.find("failover_window"); it != parsed.query.end()) {
    options.failover_window = detail::url_duration(parsed, it->first, it->second);
    parsed.query.erase(it);
  }
  if (options.failover_window.count() < 0)
    throw error(errc::invalid_argument, "database_options.failover_window must not be negative");
  if (options.pool_size == 0 || options.pool_size > 1024)
    throw error(errc::invalid_argument, "database_options.pool_size must be 1..1024");
  dia.conn.adjust_options(parsed, options);
  if (options.pooler != pooler_mode::none && !dia.sql.can().pooler)
    throw error(
        errc::invalid_argument,
        std::string(
            "database_options.pooler (or the URL key pooler) is for PostgreSQL only, not ") +
            dia.name);
  auto impl = std::make_shared<detail::database_impl>(options.pool_size);
  impl->backend = dia.name;
  impl->redacted_url = parsed.redacted;
  impl->connect_strings = dia.conn.connect_strings(parsed, options);
  impl->options = options;
  impl->dia = &dia;
  impl->tables = detail::make_table_names(options.table_prefix);
  impl->statements = detail::build_lock_statements(dia, impl->tables);
  impl->hub = std::make_shared<detail::wake_hub>(dia, dia.bell.target(parsed, options),
                                                 impl->tables, options.events);
  impl->keeper = dia.conn.keep_open(impl->connect_strings);
  impl_ = std::move(impl);
  impl_->notify([&](listener& l) { l.attached(impl_->backend); });
  // Nothing but this handle can reach an in-memory database: it gets its tables now.
  if (parsed.memory) migrate(*this);
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
  detail::with_read(impl_, "ping", [](detail::session_scope& s) {
    int one = 0;
    s.sql() << "SELECT 1", soci::into(one);
  });
}

failover_info database::failover() const {
  ping();  // a connection has opened: what its server reports is known
  return impl_->failover();
}

server_info database::server() const {
  server_info out;
  detail::with_read(impl_, "server", [&out](detail::session_scope& s) {
    out.product = s.state().product;
    out.version = s.state().version;
  });
  return out;
}

std::chrono::milliseconds min_surviving_ttl(std::chrono::milliseconds window,
                                            std::chrono::milliseconds safety_margin) noexcept {
  using std::chrono::milliseconds;
  if (window.count() <= 0) return milliseconds(0);
  // Renewed every ttl/3 and valid until ttl - margin after the last renewal: a node lost just
  // before a renewal leaves 2/3 ttl - margin to renew through another node.
  auto survives = [&](long long t) {
    const long long m =
        safety_margin.count() > 0 ? safety_margin.count() : std::max<long long>(t / 10, 1);
    return 2 * t - 3 * m > 3 * window.count();
  };
  const long long w = std::min<long long>(window.count(), 1LL << 40);
  long long t = safety_margin.count() > 0 ? (3 * (w + safety_margin.count())) / 2 : (w * 30) / 17;
  t = std::max<long long>(t - 2, 10);
  while (!survives(t))
    ++t;
  return milliseconds(t);
}

database::connection::connection(std::unique_ptr<detail::session_scope> s) : s_(std::move(s)) {}
database::connection::connection(connection&&) noexcept = default;
database::connection& database::connection::operator=(connection&&) noexcept = default;
database::connection::~connection() = default;
soci::session& database::connection::session() {
  return s_->sql();
}
void database::connection::discard() noexcept {
  if (s_) s_->mark_broken();
}

database::connection database::connect() const {
  // Not armed with a call deadline: the caller's statements run as long as they run
  // (docs/safety.md, "Deadlines"), and only pool_wait bounds the wait for a free connection.
  auto s = impl_->lease(impl_, false);
  try {
    s->dia().conn.to_session_defaults(s->sql(), s->state());
  } catch (const soci::soci_error&) {
    throw s->failure("connect: reset the session's settings");
  }
  return connection(std::move(s));
}

}  // namespace dblock
