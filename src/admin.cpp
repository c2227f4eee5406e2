#include "dblock/admin.hpp"

#include <soci/soci.h>

#include <random>

#include "database_impl.hpp"
#include "identifier.hpp"

namespace dblock {
namespace {

std::chrono::system_clock::time_point from_us(long long us) {
  return std::chrono::system_clock::time_point(std::chrono::microseconds(us));
}

std::string forced_token() {
  // A token no acquisition can have: it starts with 'f' followed by "orced" in hex-free text.
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static const char* hex = "0123456789abcdef";
  std::string t = "forced";
  while (t.size() < 32)
    t += hex[rng() % 16];
  return t;
}

}  // namespace

std::vector<lock_info> list_locks(const database& db, const list_options& o) {
  if (o.limit < 1 || o.limit > 100000)
    throw error(errc::invalid_argument, "list_locks: limit must be 1..100000");
  if (o.pattern.size() > 1000) throw error(errc::invalid_argument, "list_locks: pattern too long");
  detail::validate_text(o.pattern, "list_locks pattern");
  const auto& impl = db.impl();
  const auto& d = *impl->dia;
  return detail::with_session(impl, "list locks", [&](soci::session& sql) {
    std::string q =
        "SELECT resource_name, owner_token, fence, hold_count, holder_host, "
        "holder_pid, holder_thread, " +
        d.epoch_us_sql("acquired_at") + ", " + d.epoch_us_sql("expires_at") + ", " +
        d.epoch_us_sql(d.now_sql()) + " FROM " + impl->tables.lock + " WHERE 1 = 1";
    if (!o.include_free) q += " AND hold_count > 0 AND expires_at > " + d.now_sql();
    std::string pattern = d.name_pattern_value(o.pattern);
    if (!o.pattern.empty()) q += " AND " + d.name_pattern_sql("resource_name", "pattern");
    q += " ORDER BY resource_name LIMIT " + std::to_string(o.limit);
    // Typed into() rather than soci::row: SQLite reports computed columns without a type.
    lock_info li;
    long long fence = 0, pid = 0, acquired = 0, expires = 0, now = 0;
    soci::statement st(sql);
    if (!o.pattern.empty()) st.exchange(soci::use(pattern, "pattern"));
    st.exchange(soci::into(li.name));
    st.exchange(soci::into(li.owner_token));
    st.exchange(soci::into(fence));
    st.exchange(soci::into(li.hold_count));
    st.exchange(soci::into(li.holder_host));
    st.exchange(soci::into(pid));
    st.exchange(soci::into(li.holder_thread));
    st.exchange(soci::into(acquired));
    st.exchange(soci::into(expires));
    st.exchange(soci::into(now));
    st.alloc();
    st.prepare(q);
    st.define_and_bind();
    std::vector<lock_info> out;
    if (st.execute(true)) {
      do {
        li.fence = fence;
        li.holder_pid = pid;
        li.acquired_at = from_us(acquired);
        li.expires_at = from_us(expires);
        li.expires_in = std::chrono::microseconds(expires - now);
        li.held = li.hold_count > 0 && expires > now;
        out.push_back(li);
      } while (st.fetch());
    }
    return out;
  });
}

forced_release force_release(const database& db, const std::string& name, const std::string& reason,
                             const std::string& forced_by) {
  detail::validate_resource_name(name);
  if (reason.size() > 1000)
    throw error(errc::invalid_argument, "force_release: the reason is over 1000 bytes");
  if (forced_by.size() > 255)
    throw error(errc::invalid_argument, "force_release: forced_by is over 255 bytes");
  detail::validate_text(reason, "force_release reason");
  detail::validate_text(forced_by, "force_release forced_by");
  const auto& impl = db.impl();
  const auto& d = *impl->dia;
  const auto& t = impl->tables;
  return detail::with_session(impl, "force release of '" + name + "'", [&](soci::session& sql) {
    try {
      // Inside the try: if a set-up statement after BEGIN fails, ROLLBACK below still runs.
      d.begin_transaction(sql, std::chrono::seconds(10));
      forced_release f;
      f.name = name;
      f.forced_by = forced_by;
      f.reason = reason;
      long long fence = 0, pid = 0, expires = 0, now = 0;
      int holds = 0;
      std::string host;
      soci::indicator ind = soci::i_null;
      sql << "SELECT owner_token, fence, hold_count, holder_host, holder_pid, "
          << d.epoch_us_sql("expires_at") << ", " << d.epoch_us_sql(d.now_sql()) << " FROM "
          << t.lock << " WHERE resource_name = :name" << d.for_update_sql(),
          soci::use(name, "name"), soci::into(f.previous_owner, ind), soci::into(fence),
          soci::into(holds), soci::into(host), soci::into(pid), soci::into(expires),
          soci::into(now);
      if (!sql.got_data() || ind == soci::i_null)
        throw error(errc::not_found, "force release: no lock named '" + name + "'");
      f.previous_fence = fence;
      f.new_fence = fence + 1;
      f.previous_holder = host + ":" + std::to_string(pid);
      f.was_held = holds > 0 && expires > now;
      f.at = from_us(now);
      const std::string token = forced_token();
      sql << "UPDATE " << t.lock << " SET fence = fence + 1, owner_token = :token,"
          << " hold_count = 0, expires_at = " << d.now_sql() << " WHERE resource_name = :name",
          soci::use(token, "token"), soci::use(name, "name");
      int was_held = f.was_held ? 1 : 0;
      long long new_fence = f.new_fence, previous_fence = f.previous_fence;
      sql << "INSERT INTO " << t.audit
          << " (resource_name, new_fence, previous_fence, previous_owner, previous_holder,"
             " was_held, forced_by, reason, forced_at) VALUES (:name, :nf, :pf, :po, :ph, :wh,"
             " :by, :why, "
          << d.now_sql() << ")",
          soci::use(name, "name"), soci::use(new_fence, "nf"), soci::use(previous_fence, "pf"),
          soci::use(f.previous_owner, "po"), soci::use(f.previous_holder, "ph"),
          soci::use(was_held, "wh"), soci::use(forced_by, "by"), soci::use(reason, "why");
      sql << "COMMIT";
      d.end_transaction(sql, impl->options);
      return f;
    } catch (...) {
      try {
        sql << "ROLLBACK";
        d.end_transaction(sql, impl->options);
      } catch (...) {
      }
      throw;
    }
  });
}

std::vector<forced_release> recent_forced_releases(const database& db, std::size_t limit) {
  if (limit < 1 || limit > 10000)
    throw error(errc::invalid_argument, "recent_forced_releases: limit must be 1..10000");
  const auto& impl = db.impl();
  const auto& d = *impl->dia;
  return detail::with_session(impl, "read forced releases", [&](soci::session& sql) {
    std::vector<forced_release> out;
    forced_release f;
    long long previous = 0, next = 0, at = 0;
    int was_held = 0;
    soci::statement st(sql);
    st.exchange(soci::into(f.name));
    st.exchange(soci::into(previous));
    st.exchange(soci::into(next));
    st.exchange(soci::into(f.previous_owner));
    st.exchange(soci::into(f.previous_holder));
    st.exchange(soci::into(was_held));
    st.exchange(soci::into(f.forced_by));
    st.exchange(soci::into(f.reason));
    st.exchange(soci::into(at));
    st.alloc();
    st.prepare(
        "SELECT resource_name, previous_fence, new_fence, previous_owner, previous_holder,"
        " was_held, forced_by, reason, " +
        d.epoch_us_sql("forced_at") + " FROM " + impl->tables.audit +
        " ORDER BY forced_at DESC, new_fence DESC LIMIT " + std::to_string(limit));
    st.define_and_bind();
    if (st.execute(true)) {
      do {
        f.previous_fence = previous;
        f.new_fence = next;
        f.was_held = was_held != 0;
        f.at = from_us(at);
        out.push_back(f);
      } while (st.fetch());
    }
    return out;
  });
}

}  // namespace dblock
