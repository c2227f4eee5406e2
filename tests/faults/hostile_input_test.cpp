// T18: hostile input. Resource names that are empty, at the 255-byte limit and one over, 1 MiB,
// with NUL bytes, invalid UTF-8, emoji, confusables (`a` / `A` / `a ` / `á` in NFC and NFD),
// SQL injection and backslashes; hostile table prefixes and URLs. Checked on every backend:
// names are bound (a canary table survives), distinct byte strings never share a lock (lease and
// row lock), each name reads back byte-exact, invalid names are rejected with a short, printable
// errc::invalid_argument before any SQL is sent, and the `dblock` CLI behaves the same.
#include <fcntl.h>
#include <soci/soci.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <vector>

#include "core/identifier.hpp"
#include "core/url.hpp"
#include "dialect/dialect.hpp"
#include "harness.hpp"
#include "internals.hpp"
#include "test_paths.hpp"

extern char** environ;

using dblock::lease_lock;
using namespace dblock::test;

namespace {

constexpr std::size_t limit = dblock::detail::max_resource_name_bytes;  // 255

// The message of the dblock::error `f` throws ("<no error>" when it returns).
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const dblock::error& e) {
    return e.what();
  }
  return "<no error>";
}

// True when every byte is printable ASCII (a message never carries raw hostile bytes).
bool printable_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

// A readable form of a name for INFO() (hex for everything outside printable ASCII).
std::string show(const std::string& s) {
  std::string out;
  for (unsigned char c : s.substr(0, 80)) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  if (s.size() > 80) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// Valid names that must all be distinct locks. `canary` is the canary table's name, so that the
// injection attempts aim at a real table.
std::vector<std::string> hostile_names(const std::string& canary, const std::string& lock_table) {
  std::vector<std::string> n = {
      "a",
      "A",
      "a ",
      " a",
      "a\t",
      "\xc3\xa1",          // á, NFC (U+00E1)
      "a\xcc\x81",         // á, NFD (a + U+0301 COMBINING ACUTE ACCENT)
      "\xc3\x81",          // Á
      "\xef\xbd\x81",      // ａ FULLWIDTH LATIN SMALL LETTER A
      "\xf0\x9f\x98\x80",  // 😀
      "\xf0\x9f\x94\x92/\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87/\xe6\x97\xa5\xe6\x9c\xac",  // 🔒/ключ/日本
      "'; DROP TABLE resource_lock;--",
      "'; DROP TABLE " + lock_table + ";--",
      "'); DROP TABLE " + canary + "; --",
      "\"; DROP TABLE " + canary + "; --",
      "`; DROP TABLE " + canary + "; --",
      "\\'; DROP TABLE " + canary + "; --",  // MySQL's backslash escapes inside '...'
      "' OR '1'='1",
      "\\",
      "\\\\",
      "a\\",
      "\\0",
      "\\x00",
      "%",
      "_",
      "!",
      "!%",
      "*",
      "?",
      "[a]",
      "{{prefix}}",
      "$1",
      ":name",
      "?;",
      "\x1b[2J",  // a terminal escape sequence
      "\n",
      "\r\n",
      "\x01\x7f",
      std::string(limit, 'x'),
      std::string(limit - 1, 'x') + "y",
      std::string(limit - 2, 'x') + "\xc3\xa9",          // 255 bytes ending in é
      std::string(limit - 4, 'x') + "\xf0\x9f\x98\x80",  // 255 bytes ending in 😀
  };
  return n;
}

struct invalid_name {
  std::string name;
  std::string why;  // a word the error message must contain
};

std::vector<invalid_name> invalid_names() {
  std::string two_byte;
  for (std::size_t i = 0; i < 128; ++i)
    two_byte += "\xc3\xa9";  // 128 × é = 256 bytes
  return {
      {"", "empty"},
      {std::string(limit + 1, 'x'), "255"},
      {std::string(1 << 20, 'x'), "255"},                         // 1 MiB
      {std::string(1 << 20, '\''), "255"},                        // 1 MiB of quotes
      {std::string(limit - 2, 'x') + "\xf0\x9f\x98\x80", "255"},  // 257 bytes
      {two_byte, "255"},
      {std::string("\0", 1), "NUL"},
      {std::string("a\0b", 3), "NUL"},
      {std::string("a\0", 2), "NUL"},
      {"\xff", "UTF-8"},
      {"a\xfe", "UTF-8"},
      {"\xc3", "UTF-8"},              // truncated sequence
      {"\xc0\x80", "UTF-8"},          // overlong NUL
      {"\xc0\xaf", "UTF-8"},          // overlong '/'
      {"\xed\xa0\x80", "UTF-8"},      // surrogate
      {"\xf4\x90\x80\x80", "UTF-8"},  // past U+10FFFF
      {"\x80", "UTF-8"},              // lone continuation byte
      {"\xe2\x82", "UTF-8"},          // truncated at the end
  };
}

// Checks one rejected call: invalid_argument, short printable message naming the reason.
template <class F>
void check_rejected(const invalid_name& bad, F&& f) {
  INFO("name: " << show(bad.name));
  std::string m;
  errc code = errc::backend_error;
  bool threw = false;
  try {
    f();
  } catch (const dblock::error& e) {
    threw = true;
    code = e.kind();
    m = e.what();
  }
  CHECK(threw);
  if (!threw) return;
  INFO("message: " << show(m));
  CHECK(code == errc::invalid_argument);
  CHECK(m.size() < 400);  // a 1 MiB name is never echoed back (64 bytes at most, escaped)
  CHECK(printable_ascii(m));
  CHECK(m.find(bad.why) != std::string::npos);
}

// The whole output of a command run with posix_spawn (stdout and stderr to one file).
struct cli_run {
  int status = -1;
  std::string output;
};

cli_run run_cli(const std::vector<std::string>& args, const std::string& out_file) {
  exec_argv argv({DBLOCK_CLI_PATH}, args);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw std::runtime_error("posix_spawn of the dblock CLI failed");
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waitpid failed");
  }
  cli_run r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.output = dblock::test::read_file(out_file);
  return r;
}

std::ostream& operator<<(std::ostream& os, const cli_run& r) {
  return os << "exit " << r.status << ", output: " << show(r.output);
}

// Rows of a test table, counted.
long long count_rows(const dblock::test::context& ctx, const std::string& table) {
  auto c = ctx.db.connect();
  long long n = -1;
  c.session() << "SELECT count(*) FROM " << table, soci::into(n);
  return n;
}

}  // namespace

// ---- without a database ------------------------------------------------------------------------

TEST_CASE("hostile resource names are rejected clearly, without echoing them", "[unit][hostile]") {
  using dblock::detail::validate_resource_name;
  for (const auto& n : hostile_names("canary", "resource_lock")) {
    INFO(show(n));
    CHECK_NOTHROW(validate_resource_name(n));
  }
  for (const auto& bad : invalid_names())
    check_rejected(bad, [&] { validate_resource_name(bad.name); });
  // The limit message says what the limit is and that nothing is truncated.
  auto m = message_of([] { validate_resource_name(std::string(1 << 20, 'x')); });
  CHECK(m.find("1048576 bytes") != std::string::npos);
  CHECK(m.find("never truncated") != std::string::npos);
}

TEST_CASE("hostile table prefixes are rejected clearly", "[unit][hostile]") {
  using dblock::detail::make_table_names;
  const std::vector<std::string> bad = {
      "'; DROP TABLE resource_lock;--",
      "a\"b_",
      "a`b_",
      "a;b_",
      "a b_",
      "a-b_",
      "A_",
      "\xc3\xa1_",
      std::string("a\0b_", 4),
      "a\n_",
      "\x1b[2J_",
      "\xff_",
      "1a_",
      std::string(33, 'a'),
      std::string(1 << 20, 'a'),
      "{{prefix}}",
  };
  for (const auto& p : bad) {
    INFO(show(p));
    std::string m;
    CHECK(code_of([&] { make_table_names(p); }) == errc::invalid_argument);
    m = message_of([&] { make_table_names(p); });
    INFO(show(m));
    CHECK(m.size() < 300);
    CHECK(printable_ascii(m));
    CHECK(m.find("table prefix") != std::string::npos);
    dblock::database_options o;
    o.table_prefix = p;
    CHECK(code_of([&] { dblock::database db("sqlite:///tmp/dblock-never-created.db", o); }) ==
          errc::invalid_argument);
  }
  CHECK(::access("/tmp/dblock-never-created.db", F_OK) != 0);
  // The longest accepted prefix still yields valid identifiers for every table.
  auto t = make_table_names(std::string(32, 'a'));
  for (const auto& name : {t.lock, t.floor, t.migrations, t.audit})
    CHECK_NOTHROW(dblock::detail::validate_identifier(name, "table name"));
}

TEST_CASE("hostile URLs are rejected clearly and never echo the password", "[unit][hostile]") {
  using dblock::detail::parse_url;
  const std::string pw = "S3cr3tPw";
  const std::vector<std::string> bad = {
      "postgresql://u:" + pw + "@h/db\x1b[2J",
      "postgresql://u:" + pw + "@h/db\n",
      "postgresql://u:" + pw + "@h/db" + std::string("\0x", 2),
      "postgresql://u:" + pw + "@h/" + std::string(1 << 20, 'x'),
      "postgresql://u:" + pw + "@h/db?" + std::string(5000, '&'),
      "postgresql://u:" + pw + "@h/db/extra",
      "postgresql://u:" + pw + "@h:0/db",
      "postgresql://u:" + pw + "@h:65536/db",
      "postgresql://u:" + pw + "@h:-1/db",
      "postgresql://u:" + pw + "@h:99999999999999999999/db",
      "postgresql://u:" + pw + "@h/db?sslmode=require&sslmode=disable",
      "postgresql://u:" + pw + "@h/db?'; DROP TABLE x;--=1",
      "postgresql://u:" + pw + "@h/db#frag",
      "mysql://u:" + pw + "@h/db?init_command=DROP%20TABLE%20x",
      "postgresql://u:" + pw + "@/db",
      "postgresql://u:" + pw + "@h/\xff\xfe",
      "postgresql://u:" + pw + "@h/d%00b",
      "sqlite://u:" + pw + "@x.db",
      "sqlite:///tmp/x.db?busy_timeout=1;DROP",
      "sqlite:///tmp/\"x.db",
      "sqlite:///tmp/x.db?mode=memory",
      "postgresql://u:" + pw + "@h/db?%zz=1",
      // Passwords that RFC 3986 wants percent-encoded, given raw.
      "postgresql://u:" + pw + "/x@h/db",
      "postgresql://u:12/" + pw + "@h/db",
      "postgresql://u:" + pw + "?x@h/db",
      "postgresql://u:" + pw + "#x@h/db",
  };
  for (const auto& url : bad) {
    INFO(show(url));
    std::string m;
    try {
      auto u = parse_url(url);
      // Accepted by the parser: the dialect's own checks must reject it before connecting.
      dblock::database db(url);
      m = "<accepted>";
    } catch (const dblock::error& e) {
      CHECK(e.code() == errc::invalid_argument);
      m = e.what();
    }
    INFO(show(m));
    CHECK(m != "<accepted>");
    CHECK(m.size() < 400);
    CHECK(printable_ascii(m));
    CHECK(m.find(pw) == std::string::npos);
  }
  // The redacted form of an accepted URL hides the password however it is spelled.
  for (const std::string& url :
       {"postgresql://u:" + pw + "@h/db", "postgresql://u:%53" + pw.substr(1) + "@h/db",
        "mysql://u:" + pw + "@h:3306/db?charset=utf8mb4"}) {
    auto u = parse_url(url);
    CHECK(u.redacted.find(pw) == std::string::npos);
    CHECK(u.redacted.find(pw.substr(1)) == std::string::npos);
  }
}

// ---- on every backend --------------------------------------------------------------------------

DBLOCK_TEST("hostile names: bound, distinct, byte-exact, rejected clearly; a canary survives",
            "[faults][hostile][names]") {
  dblock::test::table_cleanup cleanup{ctx, {}};
  const std::string canary = cleanup.add(ctx.table("canary"));
  ctx.exec("CREATE TABLE " + canary + " (id INTEGER PRIMARY KEY, v VARCHAR(50) NOT NULL)");
  ctx.exec("INSERT INTO " + canary + " (id, v) VALUES (1, 'one'), (2, 'two'), (3, 'three')");
  const auto names = hostile_names(canary, ctx.db.lock_table());

  // Holding every name at once: each try_acquire succeeding means no name shares a lock with any
  // name acquired before it, so no two distinct names share a lock.
  std::vector<lease_lock> locks;
  std::vector<dblock::lease_guard> guards;
  locks.reserve(names.size());
  for (const auto& n : names) {
    INFO(show(n));
    locks.emplace_back(ctx.db, n);
    auto g = locks.back().try_acquire();
    REQUIRE(g);
    CHECK(g->name() == n);
    guards.push_back(std::move(*g));
  }
  for (const auto& n : names) {
    INFO(show(n));
    // The same byte string is the same lock.
    CHECK_FALSE(lease_lock(ctx.db, n).try_acquire());
    // Stored exactly: never truncated, padded, folded or normalised.
    auto r = dblock::test::read_lease(ctx.db.connect(), n);
    REQUIRE(r);
    CHECK(r->name == n);
    CHECK(r->hold_count == 1);
  }
  // One row per name, nothing else, and every stored name is one of ours byte for byte.
  dblock::list_options all;
  all.include_free = true;
  auto listed = dblock::list_locks(ctx.db, all);
  CHECK(listed.size() == names.size());
  for (const auto& li : listed) {
    INFO(show(li.name));
    CHECK(std::find(names.begin(), names.end(), li.name) != names.end());
  }
  // A name used as a pattern (without `*` and `?`) matches only itself: LIKE/GLOB specials in
  // names ('%', '_', '!', '[') are escaped, and matching is case- and accent-sensitive.
  for (const auto& n : names) {
    if (n.find_first_of("*?") != std::string::npos) continue;
    INFO(show(n));
    dblock::list_options o;
    o.include_free = true;
    o.pattern = n;
    auto hits = dblock::list_locks(ctx.db, o);
    REQUIRE(hits.size() == 1);
    CHECK(hits[0].name == n);
  }

  // Invalid names are rejected before any SQL, by every entry point that takes a name.
  for (const auto& bad : invalid_names()) {
    check_rejected(bad, [&] { lease_lock(ctx.db, bad.name); });
    check_rejected(bad, [&] { (void)dblock::force_release(ctx.db, bad.name, "r", "t"); });
    check_rejected(bad, [&] { (void)dblock::try_lock_resource(ctx.db, bad.name); });
    check_rejected(bad, [&] {
      dblock::transaction tx(ctx.db);
      tx.lock_resource(bad.name);
    });
  }
  CHECK(dblock::list_locks(ctx.db, all).size() == names.size());  // nothing was written

  // Releasing one name releases only that one.
  guards.front().release();
  CHECK(lease_lock(ctx.db, names[0]).try_acquire());
  for (std::size_t i = 1; i < names.size(); ++i) {
    INFO(show(names[i]));
    CHECK_FALSE(lease_lock(ctx.db, names[i]).try_acquire());
  }
  guards.clear();

  // The canary and dblock's own tables are intact.
  CHECK(count_rows(ctx, canary) == 3);
  CHECK(count_rows(ctx, ctx.db.lock_table()) == static_cast<long long>(names.size()));
  CHECK(count_rows(ctx, dblock::test::tables_of(ctx.db).floor) == 1);
}

DBLOCK_TEST_SERVERS("hostile names: distinct names never share a row lock",
                    "[faults][hostile][names]") {
  // SQLite's "row lock" is the database's single write lock, so this is for the servers only.
  const std::vector<std::string> names = {"a",
                                          "A",
                                          "a ",
                                          " a",
                                          "\xc3\xa1",
                                          "a\xcc\x81",
                                          "\\",
                                          "%",
                                          std::string(limit, 'x'),
                                          std::string(limit - 1, 'x') + "y"};
  for (const auto& held : names) {
    auto tx = dblock::try_lock_resource(ctx.db, held);
    INFO("held: " << show(held));
    REQUIRE(tx);
    for (const auto& other : names) {
      INFO("other: " << show(other));
      auto tx2 = dblock::try_lock_resource(ctx.db, other);
      CHECK(static_cast<bool>(tx2) == (other != held));
    }
    tx->rollback();
  }
}

DBLOCK_TEST("hostile names through the dblock CLI", "[faults][hostile][names][cli]") {
  dblock::test::temp_dir dir("hostile-cli");
  const std::string out = dir.file("out");
  auto cli = [&](const std::string& sub, std::vector<std::string> rest) {
    std::vector<std::string> a = {sub, "--url", ctx.url, "--table-prefix", ctx.prefix};
    a.insert(a.end(), rest.begin(), rest.end());
    return run_cli(a, out);
  };
  const std::string got = dir.file("got");
  // `exec` hands the name to the command as DBLOCK_LOCK, byte for byte.
  const std::string print_name = "printf '%s' \"$DBLOCK_LOCK\" > '" + got + "'";
  const std::vector<std::string> names = {"a",
                                          "\xc3\xa1",
                                          "a\xcc\x81",
                                          "'; DROP TABLE resource_lock;--",
                                          "\\'; DROP TABLE x; --",
                                          "\xf0\x9f\x98\x80",
                                          "--lock",
                                          "-x",
                                          std::string(limit, 'x')};
  lease_lock held(ctx.db, "a");
  auto g = held.try_acquire();
  REQUIRE(g);
  for (const auto& n : names) {
    INFO(show(n));
    auto r = cli("exec", {"--lock=" + n, "--", "sh", "-c", print_name});
    INFO(r);
    if (n == "a") {
      CHECK(r.status == 75);  // held by `g`: the same name is the same lock
      continue;
    }
    CHECK(r.status == 0);
    CHECK(dblock::test::read_file(got) == n);
  }
  // release --force takes exactly the named lease; a confusable name is not found.
  for (std::string other : {"A", "a ", "\xc3\xa1"}) {
    INFO(show(other));
    auto r = cli("release", {"--force", "--reason", "hostile test", other});
    INFO(r);
    CHECK(r.status == (other == "\xc3\xa1" ? 0 : 1));  // á exists (exec above), A and "a " not
  }
  CHECK_FALSE(lease_lock(ctx.db, "a").try_acquire());  // still ours
  auto r = cli("release", {"--force", "--reason", "'; DROP TABLE x;--", "a"});
  INFO(r);
  CHECK(r.status == 0);
  CHECK(code_of([&] { g->release(); }) == errc::lease_lost);

  // Invalid names and patterns: usage error, short message, nothing echoed raw.
  struct bad_arg {
    std::string sub;
    std::vector<std::string> args;
    std::string why;
  };
  const std::string big(100 * 1024, 'x');  // argv strings are limited to 128 KiB on Linux
  const std::vector<bad_arg> bad = {
      {"exec", {"--lock", "", "--", "true"}, "empty"},
      {"exec", {"--lock=" + big, "--", "true"}, "255"},
      {"exec", {"--lock=\xff\xfe", "--", "true"}, "UTF-8"},
      {"exec", {"--lock=a\xc0\x80", "--", "true"}, "UTF-8"},
      {"release", {"--force", "--reason", "r", big}, "255"},
      {"release", {"--force", "--reason", "r", "\xed\xa0\x80"}, "UTF-8"},
      {"status", {big}, "pattern too long"},
  };
  for (const auto& b : bad) {
    std::string shown;
    for (const auto& a : b.args)
      shown += " " + show(a);
    INFO(b.sub << shown);
    auto res = cli(b.sub, b.args);
    INFO(res);
    CHECK(res.status == 64);  // EX_USAGE
    CHECK(res.output.size() < 600);
    CHECK(printable_ascii(res.output.substr(0, res.output.size() - 1)));
    CHECK(res.output.find(b.why) != std::string::npos);
  }
  // status with hostile patterns runs and finds nothing it should not.
  for (std::string p : {"%", "_", "!", "[a]", "' OR '1'='1", "x' OR 1=1 --"}) {
    auto res = cli("status", {"--all", "--json", p});
    INFO(show(p) << " " << res);
    CHECK(res.status == 0);
    CHECK(res.output.find("\"locks\": []") != std::string::npos);
  }
  CHECK(count_rows(ctx, ctx.db.lock_table()) == static_cast<long long>(names.size()));

  // Terminal output never carries raw control characters from names or reasons: a hostile name
  // cannot clear the screen or forge a line of `dblock status`.
  const std::string evil = "\x1b[2J\x1b]0;owned\x07\rforged\nline\xc2\x9b";
  lease_lock evil_lock(ctx.db, evil);
  auto eg = evil_lock.try_acquire();
  REQUIRE(eg);
  auto st = cli("status", {});
  INFO(st);
  CHECK(st.status == 0);
  CHECK(st.output.find("\\x1b[2J") != std::string::npos);
  auto rel = cli("release", {"--force", "--reason", "bell\x07", evil});
  INFO(rel);
  CHECK(rel.status == 0);
  auto st2 = cli("status", {"--all"});
  INFO(st2);
  CHECK(st2.output.find("bell\\x07") != std::string::npos);
  for (const auto& o : {st.output, rel.output, st2.output}) {
    CHECK(o.find('\x1b') == std::string::npos);
    CHECK(o.find('\x07') == std::string::npos);
    CHECK(o.find('\r') == std::string::npos);
    CHECK(o.find("\xc2\x9b") == std::string::npos);
    CHECK(o.find("forged\nline") == std::string::npos);
  }
}

DBLOCK_TEST("hostile free text: list patterns and force_release reasons",
            "[faults][hostile][admin]") {
  lease_lock lock(ctx.db, "a");
  auto g = lock.try_acquire();
  REQUIRE(g);
  // Text that cannot be stored or bound as written (PostgreSQL text holds neither NUL nor
  // invalid UTF-8; libpq and SOCI pass C strings, so a NUL would silently cut the value) is
  // rejected up front with invalid_argument, never a raw driver error or a silent truncation.
  const std::vector<invalid_name> bad_text = {
      {std::string("a\0*", 3), "NUL"},
      {"a\xff", "UTF-8"},
      {"\xed\xa0\x80", "UTF-8"},
  };
  for (const auto& bad : bad_text) {
    check_rejected(bad, [&] {
      dblock::list_options o;
      o.include_free = true;
      o.pattern = bad.name;
      (void)dblock::list_locks(ctx.db, o);
    });
    check_rejected(bad, [&] { (void)dblock::force_release(ctx.db, "a", bad.name, "tester"); });
    check_rejected(bad, [&] { (void)dblock::force_release(ctx.db, "a", "reason", bad.name); });
  }
  CHECK_FALSE(lease_lock(ctx.db, "a").try_acquire());  // none of them released it
  CHECK(dblock::recent_forced_releases(ctx.db).empty());
  // Over-long free text: a short message, not the text.
  check_rejected({std::string(1 << 20, 'x'), "1000"}, [&] {
    (void)dblock::force_release(ctx.db, "a", std::string(1 << 20, 'x'), "tester");
  });
  check_rejected({std::string(1001, 'x'), "pattern"}, [&] {
    dblock::list_options o;
    o.pattern = std::string(1001, 'x');
    (void)dblock::list_locks(ctx.db, o);
  });
  // Hostile but valid text is stored and read back exactly.
  const std::string reason = "'; DROP TABLE " + ctx.db.lock_table() + ";-- \\ \xf0\x9f\x98\x80";
  const std::string by = "\"; DELETE FROM x; -- \xc3\xa1";
  auto f = dblock::force_release(ctx.db, "a", reason, by);
  CHECK(f.name == "a");
  auto recent = dblock::recent_forced_releases(ctx.db);
  REQUIRE(recent.size() == 1);
  CHECK(recent[0].reason == reason);
  CHECK(recent[0].forced_by == by);
  CHECK(code_of([&] { g->release(); }) == errc::lease_lost);
}
