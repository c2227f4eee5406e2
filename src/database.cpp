#include "dblock/database.hpp"

#include <soci/soci.h>

#include "storage/session.hpp"
#include "storage/statements.hpp"
#include "url.hpp"
#include "wake/hub.hpp"

namespace dblock {

database::database(const std::string& url, database_options options) {
  auto parsed = detail::parse_url(url);
  const auto& dia = detail::dialect_for_scheme(parsed.scheme);
  if (options.pool_size == 0 || options.pool_size > 1024)
    throw error(errc::invalid_argument, "database_options.pool_size must be 1..1024");
  dia.conn.adjust_options(parsed, options);
  if (options.pooler != pooler_mode::none && !dia.conn.accepts_pooler())
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
  impl->hub = std::make_unique<detail::wake_hub>(dia, dia.bell.target(parsed, options),
                                                 impl->tables, options.events);
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
  detail::with_session(impl_, "ping", [](detail::session_scope& s) {
    int one = 0;
    s.sql() << "SELECT 1", soci::into(one);
  });
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
  auto s = impl_->lease(impl_);
  try {
    s->dia().conn.to_session_defaults(s->sql(), s->state());
  } catch (const soci::soci_error&) {
    throw s->failure("connect: reset the session's settings");
  }
  return connection(std::move(s));
}

}  // namespace dblock
