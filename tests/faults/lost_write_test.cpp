// Lost replies of the data features' writes (docs/safety.md E1): a versioned update reads its
// outcome back where the row can decide it (the version is still the one it read: not applied,
// sent again); a compare-and-set and a stock take or put, whose rows cannot tell this call's
// write from another's, say in_doubt, with the server session ended first so that a read gives
// the final outcome. Each test proves its fault: the proxy cut exactly one connection, and the
// row shows whether the server ran the statement.
#include <soci/soci.h>

#include <optional>
#include <string>

#include "dblock/optimistic.hpp"
#include "dblock/segmented_stock.hpp"
#include "fault_support.hpp"
#include "harness.hpp"
#include "proxy.hpp"

using namespace dblock;
using namespace dblock::test;

namespace {

// <prefix>acct (id, balance, version) with the row (1, 0, 0).
std::string create_acct(const context& ctx, table_cleanup& cleanup) {
  const std::string t = cleanup.add(ctx.table("acct"));
  ctx.exec("CREATE TABLE " + t +
           " (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)");
  ctx.exec("INSERT INTO " + t + " (id, balance, version) VALUES (1, 0, 0)");
  return t;
}

versioned_table acct_spec(const std::string& table) {
  versioned_table s;
  s.table = table;
  s.key_column = "id";
  s.columns = {"balance"};
  return s;
}

// The amount every write here adds: its digits appear in what the client sends for the UPDATE
// and in nothing else of the test (PostgreSQL: the Bind of the prepared statement, sent after
// its Parse; MySQL: the text of the query), so that the proxy cuts that very message.
constexpr long long amount = 1000003;
const std::string amount_text = std::to_string(amount);

void add_amount(record& r) {
  r["balance"] = std::get<long long>(r.at("balance")) + amount;
}

// balance and version of row 1.
std::pair<long long, long long> read_acct(const database& db, const std::string& table) {
  auto c = db.connect();
  long long balance = -1, version = -1;
  c.session() << "SELECT balance, version FROM " << table << " WHERE id = 1", soci::into(balance),
      soci::into(version);
  return {balance, version};
}

// The account table, and a handle that reaches the server through a proxy.
struct accounts_via_proxy {
  tcp_proxy proxy;
  table_cleanup cleanup;
  std::string table;
  database via;
  explicit accounts_via_proxy(const context& ctx)
      : proxy(url_host_port(ctx.url).first, url_host_port(ctx.url).second),
        cleanup{ctx, {}},
        table(create_acct(ctx, cleanup)),
        via(open_db(url_via(ctx.url, proxy.port()), ctx.prefix, 2)) {}
};

// What a call threw, with its message.
struct outcome {
  std::optional<errc> code;
  std::string message;
};

std::string said(const outcome& o) {
  return o.code ? std::string(to_string(*o.code)) + ": " + o.message : "returned";
}

template <class F>
outcome run(F&& f) {
  outcome o;
  try {
    f();
  } catch (const error& e) {
    o.code = e.kind();
    o.message = e.what();
  }
  return o;
}

}  // namespace

// The proxy drops the UPDATE before the server sees it and resets the connection. The version
// read back is still the one the attempt read: not applied, so the update is sent again and
// applied exactly once. (Before this was decided, the call said in_doubt.)
DBLOCK_TEST_SERVERS("a versioned update whose UPDATE never reached the server is sent again",
                    "[faults][lost-reply]") {
  accounts_via_proxy a(ctx);
  tcp_proxy& proxy = a.proxy;
  const std::string& t = a.table;
  proxy.cut_request_to(amount_text, false);
  std::optional<versioned_result> r;
  const outcome o = run([&] { r = versioned_update(a.via, acct_spec(t), 1LL, add_amount); });
  const long long cuts = proxy.cuts();
  proxy.cut_request_to("", false);
  INFO("versioned_update: " << said(o));
  CHECK(cuts == 1);  // the fault happened
  CHECK_FALSE(o.code);
  REQUIRE(r);
  CHECK(r->version == 1);
  CHECK(read_acct(ctx.db, t) == std::make_pair(amount, 1LL));  // applied once
}

// The server runs the UPDATE and its reply is lost: the row holds the next version, which this
// call's write and another writer's cannot be told apart by: in_doubt, final (the session was
// ended), and the update was applied exactly once, never sent again.
DBLOCK_TEST_SERVERS("a versioned update whose reply is lost is in_doubt and never sent again",
                    "[faults][lost-reply]") {
  accounts_via_proxy a(ctx);
  tcp_proxy& proxy = a.proxy;
  const std::string& t = a.table;
  proxy.cut_reply_to(amount_text);
  const outcome o = run([&] { versioned_update(a.via, acct_spec(t), 1LL, add_amount); });
  const long long cuts = proxy.cuts();
  proxy.cut_reply_to("");
  INFO("versioned_update: " << said(o));
  CHECK(cuts == 1);
  CHECK(o.code == errc::in_doubt);
  CHECK(o.message.find("holds version 1") != std::string::npos);
  CHECK(read_acct(ctx.db, t) == std::make_pair(amount, 1LL));  // the server ran it, once
}

// On the caller's connection without a transaction: the UPDATE that never reached the server is
// read back as not applied and reported connection_lost (nothing written), never sent again on
// that connection.
DBLOCK_TEST_SERVERS(
    "a versioned update on the caller's connection whose UPDATE was lost is "
    "connection_lost with nothing written",
    "[faults][lost-reply]") {
  accounts_via_proxy a(ctx);
  tcp_proxy& proxy = a.proxy;
  const std::string& t = a.table;
  auto conn = a.via.connect();
  proxy.cut_request_to(amount_text, false);
  const outcome o = run([&] { versioned_update(conn, acct_spec(t), 1LL, add_amount); });
  const long long cuts = proxy.cuts();
  proxy.cut_request_to("", false);
  INFO("versioned_update: " << said(o));
  CHECK(cuts == 1);
  CHECK(o.code == errc::connection_lost);
  CHECK(o.message.find("nothing was written") != std::string::npos);
  CHECK(read_acct(ctx.db, t) == std::make_pair(0LL, 0LL));
}

// compare_and_set: the caller's SET and WHERE cannot be read back, so both cuts are in_doubt;
// the message says the read is final (the session was ended), and the row shows what the
// server did: nothing when the request was dropped, one decrement when the reply was.
DBLOCK_TEST_SERVERS("a compare-and-set whose request or reply is lost is in_doubt, finally",
                    "[faults][lost-reply]") {
  accounts_via_proxy a(ctx);
  tcp_proxy& proxy = a.proxy;
  const std::string& t = a.table;
  const cas_update add{
      t, "balance = balance + :amount", "id = :id", {{"amount", amount}, {"id", 1LL}}};
  for (const bool reply : {false, true}) {
    if (reply)
      proxy.cut_reply_to(amount_text);
    else
      proxy.cut_request_to(amount_text, false);
    const long long before = proxy.cuts();
    const outcome o = run([&] { compare_and_set(a.via, add); });
    const long long cuts = proxy.cuts() - before;
    proxy.cut_reply_to("");
    proxy.cut_request_to("", false);
    INFO((reply ? "reply" : "request") << " cut; compare_and_set: " << said(o));
    CHECK(cuts == 1);
    CHECK(o.code == errc::in_doubt);
    CHECK(o.message.find("has been ended") != std::string::npos);
    CHECK(read_acct(ctx.db, t).first == (reply ? amount : 0));  // the server ran it once
  }
}

// A stock take and put: a segment's amount cannot tell this call's change from another's, so a
// lost reply is in_doubt (final), and the total shows the server ran each exactly once.
DBLOCK_TEST_SERVERS("a stock take or put whose reply is lost is in_doubt and never sent again",
                    "[faults][lost-reply]") {
  tcp_proxy proxy(url_host_port(ctx.url).first, url_host_port(ctx.url).second);
  const std::string name = "lost-stock-" + random_suffix();
  segmented_stock(ctx.db, name).create(5 * amount, 1);
  auto via = open_db(url_via(ctx.url, proxy.port()), ctx.prefix, 2);
  segmented_stock stock(via, name);
  CHECK(stock.total() == 5 * amount);  // through the proxy, before any cut
  proxy.cut_reply_to(amount_text);
  const outcome take = run([&] { stock.take(amount); });
  CHECK(proxy.cuts() == 1);
  proxy.cut_reply_to(std::to_string(2 * amount));
  const outcome put = run([&] { stock.put(2 * amount); });
  CHECK(proxy.cuts() == 2);
  proxy.cut_reply_to("");
  INFO("take: " << said(take));
  INFO("put: " << said(put));
  CHECK(take.code == errc::in_doubt);
  CHECK(put.code == errc::in_doubt);
  CHECK(take.message.find("has been ended") != std::string::npos);
  CHECK(segmented_stock(ctx.db, name).total() == 5 * amount - amount + 2 * amount);  // each once
  segmented_stock(ctx.db, name).drop();
}
