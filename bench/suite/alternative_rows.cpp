// The alternatives users pick instead of dblock: PostgreSQL's advisory locks, MySQL's GET_LOCK()
// and a Redis lock (SET NX PX + compare-and-delete). None gives a fencing token.
#include <soci/soci.h>
#include <unistd.h>
#include <dblock/dblock.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/identifier.hpp"
#include "rows.hpp"
#include "storage/session.hpp"

#ifdef DBLOCK_HAVE_HIREDIS
#include <hiredis/hiredis.h>
#endif

namespace dblock::bench {
namespace {

#ifdef DBLOCK_HAVE_HIREDIS
setup_fn redis_setup(const std::string& hostport, int keys) {
  return [hostport, keys](int t) {
    auto colon = hostport.rfind(':');
    const std::string host = hostport.substr(0, colon);
    const int port = std::stoi(hostport.substr(colon + 1));
    std::shared_ptr<redisContext> c(redisConnect(host.c_str(), port), redisFree);
    if (!c || c->err)
      throw std::runtime_error("redis: cannot connect to " + hostport + ": " +
                               (c ? c->errstr : "out of memory"));
    // Compare-and-delete: delete the key only while it still carries our token.
    auto* load = static_cast<redisReply*>(redisCommand(
        c.get(), "SCRIPT LOAD %s",
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
        "else return 0 end"));
    if (!load || load->type != REDIS_REPLY_STRING)
      throw std::runtime_error("redis: SCRIPT LOAD failed");
    const std::string sha(load->str, load->len);
    freeReplyObject(load);
    return cycle_fn([c, sha, t, keys] {
      const std::string k = "bench:" + std::to_string(t) + ":" + std::to_string(rand_below(keys));
      const std::string tok = token();
      auto* r = static_cast<redisReply*>(
          redisCommand(c.get(), "SET %s %s NX PX 30000", k.c_str(), tok.c_str()));
      if (!r) throw std::runtime_error("redis: connection lost");
      const bool got = r->type == REDIS_REPLY_STATUS;
      freeReplyObject(r);
      if (!got) return false;
      r = static_cast<redisReply*>(
          redisCommand(c.get(), "EVALSHA %s 1 %s %s", sha.c_str(), k.c_str(), tok.c_str()));
      if (!r) throw std::runtime_error("redis: connection lost");
      const bool del = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
      freeReplyObject(r);
      return del;
    });
  };
}
#endif

// The sequence of the fenced rows' fences (the design of session leases: a fence from a sequence
// in the lock statement itself).
std::string fence_sequence(const backend_ctx& b) {
  return b.prefix + "bench_fence_seq";
}

bool is_mariadb(const backend_ctx& b) {
  return b.version.find("MariaDB") != std::string::npos;
}

// `s` as one word of the shell.
std::string shell_word(const std::string& s) {
  std::string out = "'";
  for (const char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Creates the fenced rows' sequence (their prepare step).
void create_fence_sequence(backend_ctx& b, std::ostream&) {
  b.db.connect().session() << "CREATE SEQUENCE IF NOT EXISTS " + fence_sequence(b);
}

// The fenced advisory lock of key :k: its fence when taken, else 0 (pg.advisory_fenced's and
// pgbench.advisory_fenced's statement).
std::string pg_fenced_lock(const backend_ctx& b) {
  return "SELECT CASE WHEN pg_try_advisory_lock(:k) THEN nextval('" + fence_sequence(b) +
         "') ELSE 0 END";
}

// Runs pgbench (-M prepared, one thread per client) on `script` for the row's time; reads its
// transactions per second and average latency.
result run_pgbench(const backend_ctx& b, const std::string& script, int clients, double seconds) {
  result r;
  r.clients = clients;
  const auto dir = std::filesystem::temp_directory_path();
  const std::string file =
      (dir / ("dblock-bench-" + std::to_string(::getpid()) + "-" + token() + ".sql")).string();
  std::ofstream(file) << script;
  const int secs = std::max(1, static_cast<int>(std::lround(seconds)));
  const std::string n = std::to_string(clients);
  const std::string cmd = "pgbench -n -M prepared -c " + n + " -j " + n + " -T " +
                          std::to_string(secs) + " -f " + shell_word(file) + " " +
                          shell_word(libpq_conninfo(b.url)) + " 2>&1";
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, f))
      out += buf;
    if (::pclose(f) != 0) r.first_error = "pgbench failed: " + out.substr(0, 400);
  } else {
    r.first_error = "cannot run pgbench";
  }
  std::filesystem::remove(file);
  const auto num = [&](const std::string& after) {
    const auto at = out.find(after);
    return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + after.size());
  };
  // pgbench prints no rate when no transaction completed in its window (its connections took it
  // all on a loaded machine): a row that did nothing, like any other's, not an error.
  if (r.first_error.empty() && num("number of transactions actually processed: ") == 0) {
    r.note = "; pgbench completed no transaction in its " + std::to_string(secs) + " s";
    return r;
  }
  r.per_second = num("tps = ");
  const double latency_ms = num("latency average = ");
  if (r.per_second < 0 || latency_ms < 0) {
    if (r.first_error.empty()) r.first_error = "no tps in pgbench's output: " + out.substr(0, 400);
    r.per_second = 0;
    r.errors = 1;
    return r;
  }
  r.operations = r.successes = static_cast<long long>(r.per_second * secs);
  r.figures["latency_mean_us"] = latency_ms * 1000;
  r.note = "; pgbench's own count over " + std::to_string(secs) + " s; its mean latency " +
           std::to_string(static_cast<long long>(latency_ms * 1000)) +
           " us (pgbench reports no percentiles: the p50 and p99 columns stay 0)";
  return r;
}

// A row run by pgbench: `statements` once per cycle on key :k, distinct per client.
row pgbench_row(const std::string& name, const std::string& floor, const std::string& note,
                const std::string& statements, const options& o) {
  const std::string script = "\\set k 1000000 * (:client_id + 1) + random(0, " +
                             std::to_string(std::max(1, o.keys) - 1) + ")\n" + statements;
  row r = make_row(name, "alternative", floor, note, schedule::external,
                   [script, seconds = o.seconds](backend_ctx* b, int clients, std::ostream&) {
                     return run_pgbench(*b, script, clients, seconds);
                   });
  if (std::system("command -v pgbench > /dev/null 2>&1") != 0)
    r.skipped = "pgbench is not installed (Debian: postgresql-client)";
  return r;
}

// pg_try_advisory_lock with a fence from a sequence in the same statement, and the unlock: the
// floor of a session lease's cycle (fences without a row write).
row pg_advisory_fenced(int keys) {
  row r{"pg.advisory_fenced", "alternative", "pg.advisory",
        "pg_try_advisory_lock + nextval(sequence) in one statement, pg_advisory_unlock: the "
        "floor of a session lease (a fence, no row write)"};
  r.setup = [keys](backend_ctx& b, int t) {
    auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
    const std::string lock = pg_fenced_lock(b);
    return cycle_fn([c, t, keys, lock] {
      const long long k = 1000000LL * (t + 1) + rand_below(keys);
      if (c->run("adv_fenced", lock, {{"k", k}}).value.value_or(0) <= 0) return false;
      return c->run("adv_unlock", "SELECT pg_advisory_unlock(:k)::int", {{"k", k}}).value == 1;
    });
  };
  r.prepare = create_fence_sequence;
  return r;
}

// GET_LOCK with a fence from a MariaDB SEQUENCE in the same statement, and RELEASE_LOCK.
row mysql_get_lock_fenced(const backend_ctx& on, int keys) {
  row r{"mysql.get_lock_fenced", "alternative", "mysql.get_lock",
        "GET_LOCK(name, 0) + NEXTVAL(sequence) in one statement, RELEASE_LOCK: the floor of a "
        "session lease (MariaDB's SEQUENCE; a fence, no row write)"};
  r.setup = [keys](backend_ctx& b, int t) {
    auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
    const std::string lock =
        "SELECT IF(GET_LOCK(:k, 0) = 1, NEXTVAL(" + fence_sequence(b) + "), 0)";
    return cycle_fn([c, t, keys, lock] {
      const std::string k = key_name(t, keys);
      if (c->run("gl_fenced", lock, {{"k", k}}).value.value_or(0) <= 0) return false;
      return c->run("rl", "SELECT RELEASE_LOCK(:k)", {{"k", k}}).value == 1;
    });
  };
  r.prepare = create_fence_sequence;
  if (!is_mariadb(on))
    r.skipped = "MySQL has no SEQUENCE (MariaDB 10.3 and later have); server " + on.version;
  return r;
}

// GET_LOCK with a fence from a counter row per name, as MySQL 8 (no SEQUENCE) would have to
// give one: an autocommit upsert that bumps the name's counter and hands the value back through
// LAST_INSERT_ID(expr) in the OK packet (a durable write per grant), then RELEASE_LOCK. The floor
// of a session lease on MySQL 8, to set beside dblock.lease (row mode: two durable writes per
// cycle) when deciding whether session mode pays there (docs/mysql.md).
row mysql_get_lock_counter(int keys) {
  row r{"mysql.get_lock_counter", "alternative", "mysql.get_lock",
        "GET_LOCK(name, 0), an upsert bumping the name's counter row with LAST_INSERT_ID(v + 1) "
        "(autocommit, durable), RELEASE_LOCK: the floor of a session lease on MySQL 8"};
  r.setup = [keys](backend_ctx& b, int t) {
    auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
    const std::string bump = "INSERT INTO " + b.prefix +
                             "bench_fence_counter (name, v) VALUES (:k, LAST_INSERT_ID(1)) ON "
                             "DUPLICATE KEY UPDATE v = LAST_INSERT_ID(v + 1)";
    return cycle_fn([c, t, keys, bump] {
      const std::string k = key_name(t, keys);
      if (c->run("gl", "SELECT GET_LOCK(:k, 0)", {{"k", k}}).value != 1) return false;
      const bool fenced = c->run("bump", bump, {{"k", k}}).insert_id > 0;
      return c->run("rl", "SELECT RELEASE_LOCK(:k)", {{"k", k}}).value == 1 && fenced;
    });
  };
  r.prepare = [](backend_ctx& b, std::ostream&) {
    b.db.connect().session() << "CREATE TABLE IF NOT EXISTS " + b.prefix +
                                    "bench_fence_counter (name VARCHAR(190) PRIMARY KEY, v BIGINT "
                                    "NOT NULL) ENGINE=InnoDB";
  };
  return r;
}

// `keys` names `prefix` + k, each marked for session mode: a name's first session-mode acquire
// marks it (one durable write, once per name), done at set-up, outside the measurement, which is
// about the steady state.
std::vector<std::string> marked_session_names(backend_ctx& b, const std::string& prefix, int keys) {
  std::vector<std::string> names;
  for (int k = 0; k < keys; ++k) {
    names.push_back(prefix + std::to_string(k));
    if (auto g =
            dblock::lease_lock(b.db, names.back(), {}, dblock::lease_mode::session).try_acquire())
      g->release();
  }
  return names;
}

// raw.lease_session: the C client running dblock's own session-lease statements (the lock with
// its fence, the unlock) on names dblock marked: dblock.lease_session's floor on this server
// without the library's client path (its ratio to this row is the library's own cost).
row raw_session_row(int keys, const char* anchor) {
  row r{"raw.lease_session", "alternative", anchor,
        "dblock's session-lease statements through the C client: the lock with its fence (the "
        "marker's and the sequence's), the unlock; names marked at set-up"};
  r.setup = [keys](backend_ctx& b, int t) {
    auto names = std::make_shared<std::vector<std::string>>(
        marked_session_names(b, "bench/session-raw/" + std::to_string(t) + "/", keys));
    const auto& st = detail::access::impl(b.db)->statements;
    auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
    return cycle_fn([c, names, keys, lock = st.session_try.text, unlock = st.session_unlock.text,
                     prefix = b.prefix] {
      const std::string& name = (*names)[static_cast<std::size_t>(rand_below(keys))];
      const std::string key = prefix + std::string(detail::internal_separator) + name;
      const params p = {{"key", key}, {"name", name}, {"marker", std::string(32, '0')}};
      if (c->run("s_try", lock, p).value.value_or(0) <= 0) return false;
      return c->run("s_unlock", unlock, {{"key", key}}).value == 1;
    });
  };
  return r;
}

// dblock.lease_session: lease_lock with lease_mode::session, against the server's own session
// lock (`anchor`).
row lease_session_row(int keys, const char* anchor) {
  row ls{"dblock.lease_session", "alternative", anchor,
         "lease_lock with lease_mode::session: try_acquire() + release(), distinct keys (the lock "
         "with its fence, the unlock; the idle timeout is set once per connection)"};
  ls.setup = [keys](backend_ctx& b, int t) {
    auto locks = std::make_shared<std::vector<dblock::lease_lock>>();
    for (const auto& name :
         marked_session_names(b, "bench/session/" + std::to_string(t) + "/", keys))
      locks->emplace_back(b.db, name, dblock::lease_options{}, dblock::lease_mode::session);
    return cycle_fn([locks, keys] {
      auto g = (*locks)[static_cast<std::size_t>(rand_below(keys))].try_acquire();
      if (!g) return false;
      g->release();
      return true;
    });
  };
  return ls;
}

}  // namespace

std::vector<row> alternative_rows(backend_ctx& b, const options& o) {
  const bool pg = b.backend == "postgresql", my = b.backend == "mysql";
  const int keys = o.keys;
  std::vector<row> ops;
  // A session-level advisory lock cannot be kept behind a transaction-mode pooler.
  if (pg && b.db.options().pooler != dblock::pooler_mode::transaction)
    ops.push_back(
        {"pg.advisory", "alternative", "",
         "pg_try_advisory_lock + pg_advisory_unlock, distinct keys (no fencing, no "
         "lease: dies with the session)",
         [keys](backend_ctx& b, int t) {
           auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
           return cycle_fn([c, t, keys] {
             const long long k = 1000000LL * (t + 1) + rand_below(keys);
             if (c->run("adv_lock", "SELECT pg_try_advisory_lock(:k)::int", {{"k", k}}).value != 1)
               return false;
             return c->run("adv_unlock", "SELECT pg_advisory_unlock(:k)::int", {{"k", k}}).value ==
                    1;
           });
         }});
  if (pg && b.db.options().pooler != dblock::pooler_mode::transaction) {
    ops.push_back(pg_advisory_fenced(keys));
    if (b.session_leases) ops.push_back(lease_session_row(keys, "pg.advisory"));
    if (b.session_leases) ops.push_back(raw_session_row(keys, "pg.advisory"));
    ops.push_back(pgbench_row("pgbench.advisory", "pg.advisory",
                              "pgbench -M prepared running pg.advisory's cycle (the best "
                              "client's figure for the anchor)",
                              "SELECT pg_try_advisory_lock(:k);\nSELECT pg_advisory_unlock(:k);\n",
                              o));
    ops.push_back(pgbench_row("pgbench.advisory_fenced", "pg.advisory_fenced",
                              "pgbench -M prepared running pg.advisory_fenced's cycle",
                              pg_fenced_lock(b) + ";\nSELECT pg_advisory_unlock(:k);\n", o));
  }
  if (my) ops.push_back(mysql_get_lock_fenced(b, keys));
  if (my) ops.push_back(mysql_get_lock_counter(keys));
  if (my && b.session_leases) ops.push_back(lease_session_row(keys, "mysql.get_lock"));
  if (my && b.session_leases) ops.push_back(raw_session_row(keys, "mysql.get_lock"));
  if (my)
    ops.push_back({"mysql.get_lock", "alternative", "",
                   "GET_LOCK(name, 0) + RELEASE_LOCK, distinct names (no fencing, no lease)",
                   [keys](backend_ctx& b, int t) {
                     auto c = std::shared_ptr<raw_client>(connect_raw(b.url));
                     return cycle_fn([c, t, keys] {
                       const std::string k = key_name(t, keys);
                       if (c->run("gl", "SELECT GET_LOCK(:k, 0)", {{"k", k}}).value != 1)
                         return false;
                       return c->run("rl", "SELECT RELEASE_LOCK(:k)", {{"k", k}}).value == 1;
                     });
                   }});
  return ops;
}

std::vector<row> backendless_rows(const options& o) {
  // The harness's own cost: a cycle that does nothing, timed as every row's cycle is. Its p50 is
  // what the clock and the threads add to every figure; its rate is the most any row can show.
  row noop = make_row(
      "harness.noop", "floor", "",
      "a cycle that does nothing: the measuring harness's own cost at this client count",
      schedule::per_count, [seconds = o.seconds](backend_ctx*, int clients, std::ostream&) {
        result r = measure(clients, seconds, [](int) { return cycle_fn([] { return true; }); });
        r.backend = r.label = "none";
        return r;
      });
  row redis =
      make_row("redis.lock", "alternative", "",
               "SET key token NX PX + compare-and-delete Lua (EVALSHA); in memory, no fencing",
               schedule::per_count, {});
  if (o.redis.empty()) {
    redis.skipped =
        "no --redis HOST:PORT given (scripts/bench.sh starts a throwaway redis-server when one "
        "is installed)";
    return {noop, redis};
  }
#ifdef DBLOCK_HAVE_HIREDIS
  redis.run = [hostport = o.redis, seconds = o.seconds, keys = o.keys](backend_ctx*, int clients,
                                                                       std::ostream&) {
    result r;
    try {
      r = measure(clients, seconds, redis_setup(hostport, keys));
    } catch (const std::exception& e) {
      r.clients = clients;
      r.errors = 1;
      r.first_error = e.what();
    }
    r.backend = r.label = "redis";
    return r;
  };
#else
  redis.skipped = "this dblock was built without hiredis (libhiredis-dev)";
#endif
  return {noop, redis};
}

}  // namespace dblock::bench
