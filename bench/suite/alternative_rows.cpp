// The alternatives users pick instead of dblock: PostgreSQL's advisory locks, MySQL's GET_LOCK()
// and a Redis lock (SET NX PX + compare-and-delete). None gives a fencing token.
#include <dblock/dblock.hpp>

#include <exception>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rows.hpp"

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
  row redis =
      make_row("redis.lock", "alternative", "",
               "SET key token NX PX + compare-and-delete Lua (EVALSHA); in memory, no fencing",
               schedule::per_count, {});
  if (o.redis.empty()) {
    redis.skipped =
        "no --redis HOST:PORT given (scripts/bench.sh starts a throwaway redis-server when one "
        "is installed)";
    return {redis};
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
  return {redis};
}

}  // namespace dblock::bench
