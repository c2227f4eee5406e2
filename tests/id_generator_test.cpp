// The ID generator (dblock::id_generator) on every backend: unique IDs from several generator
// objects and threads, increasing blocks, the id_block row never behind an issued ID, a counter
// ahead of the clock (as after a clock step back) never yielding a duplicate, bad input, errors
// of the background reservation, 8 processes with kill -9 and restarts plus one process whose
// clock is an hour back (libfaketime), where a clock-only generator run alongside in the same
// processes collides (the negative control), and the `dblock id` command.
//
// Catch2 assertions are not thread-safe: worker threads only record what they saw, and the
// test thread asserts afterwards.
#include <fcntl.h>
#include <signal.h>
#include <soci/soci.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "harness.hpp"
#include "test_paths.hpp"

using dblock::id_generator;
using dblock::id_generator_options;
using namespace dblock::test;

namespace {

std::int64_t now_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// What a generator that used only the clock would start at now: (now - epoch) << 22.
std::int64_t clock_only_value() {
  return (now_ms() - id_generator::epoch_ms) * id_generator::per_ms;
}

// A clock-only ID generator, as a naive user might write one (the negative control of the
// process test): the milliseconds since id_generator's epoch, shifted like id_generator's IDs,
// plus a sequence number within the millisecond. Unique within one object; nothing keeps two
// objects (two processes) that issue IDs in the same millisecond apart.
class clock_only_generator {
 public:
  std::int64_t next() {
    const std::int64_t ms = now_ms() - id_generator::epoch_ms;
    seq_ = ms == last_ms_ ? seq_ + 1 : 0;
    last_ms_ = ms;
    return ms * id_generator::per_ms + seq_;
  }

 private:
  std::int64_t last_ms_ = -1, seq_ = 0;
};

// The generator's next_id in the id_block table (-1 when there is no row).
long long row_next_id(const dblock::test::context& ctx, const std::string& name) {
  auto c = ctx.db.connect();
  long long v = -1;
  soci::indicator ind = soci::i_ok;
  c.session() << "SELECT next_id FROM " << ctx.table("id_block") << " WHERE generator = :g",
      soci::use(name), soci::into(v, ind);
  return c.session().got_data() ? v : -1;
}

// The duplicates in a list of IDs.
std::vector<std::int64_t> duplicates(std::vector<std::int64_t> ids) {
  std::sort(ids.begin(), ids.end());
  std::vector<std::int64_t> d;
  for (std::size_t i = 1; i < ids.size(); ++i)
    if (ids[i] == ids[i - 1]) d.push_back(ids[i]);
  return d;
}

// The IDs of one generator object used by one thread come in whole blocks: chunk j of
// `block` consecutive IDs is one block, inside [min, min + block), and every ID of chunk j+1 is
// above every ID of chunk j. Returns a description of the first violation, or "".
std::string check_blocks(const std::vector<std::int64_t>& ids, std::int64_t block) {
  std::int64_t prev_max = -1;
  for (std::size_t start = 0; start < ids.size(); start += static_cast<std::size_t>(block)) {
    const auto end = std::min(ids.size(), start + static_cast<std::size_t>(block));
    const auto [lo, hi] = std::minmax_element(ids.begin() + static_cast<std::ptrdiff_t>(start),
                                              ids.begin() + static_cast<std::ptrdiff_t>(end));
    if (*hi - *lo >= block)
      return "chunk at " + std::to_string(start) + " spans " + std::to_string(*hi - *lo + 1) +
             " values, more than one block";
    if (*lo <= prev_max)
      return "chunk at " + std::to_string(start) + " starts at " + std::to_string(*lo) +
             ", not above the previous chunk's " + std::to_string(prev_max);
    prev_max = *hi;
  }
  return "";
}

// How many positions of `ids` hold a smaller value than the position before.
std::size_t descents(const std::vector<std::int64_t>& ids) {
  std::size_t n = 0;
  for (std::size_t i = 1; i < ids.size(); ++i)
    n += ids[i] < ids[i - 1];
  return n;
}

// Parses the complete lines of a worker's output file: IDs, and "# key value" notes.
struct worker_output {
  std::vector<std::int64_t> ids;
  long long clock_offset_s = 0;  // "# clock_offset_s": its clock minus the parent's
  long long clock_only = -1;     // "# clock_only": (its now - epoch) << 22 at its start
  bool done = false;             // "# done"
  std::size_t bad_lines = 0;     // complete lines that are no ID
};

worker_output parse_output(const std::string& text) {
  worker_output o;
  std::size_t pos = 0;
  for (;;) {
    const auto nl = text.find('\n', pos);
    if (nl == std::string::npos) break;  // a line cut short by kill -9 is ignored
    const std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (line.rfind("# ", 0) == 0) {
      std::istringstream in(line.substr(2));
      std::string key;
      long long v = 0;
      in >> key >> v;
      if (key == "clock_offset_s") o.clock_offset_s = v;
      if (key == "clock_only") o.clock_only = v;
      if (key == "done") o.done = true;
      continue;
    }
    try {
      std::size_t used = 0;
      const long long id = std::stoll(line, &used);
      if (used != line.size() || id <= 0) throw std::invalid_argument(line);
      o.ids.push_back(id);
    } catch (const std::exception&) {
      ++o.bad_lines;
    }
  }
  return o;
}

// Appends text to an O_APPEND file descriptor in one write (whole lines only).
void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n <= 0) std::_Exit(21);
    off += static_cast<std::size_t>(n);
  }
}

}  // namespace

// ---- worker process: args url prefix name count block_size pace_us out_file parent_realtime_ms
// Writes the generator's IDs to out_file and, for each of them, one ID of a clock-only generator
// made at the same moment to out_file + ".clock" (the negative control).

DBLOCK_WORKER(id_worker) {
  const std::string url = args.at(0), prefix = args.at(1), name = args.at(2);
  const long long count = std::stoll(args.at(3));
  id_generator_options o;
  o.block_size = std::stoll(args.at(4));
  const long long pace_us = std::stoll(args.at(5));
  const std::string out_file = args.at(6);
  const long long parent_ms = std::stoll(args.at(7));
  const int fd = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return 20;
  const std::string clock_file = out_file + ".clock";
  const int clock_fd = ::open(clock_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (clock_fd < 0) return 20;
  write_all(fd, "# clock_offset_s " + std::to_string((now_ms() - parent_ms) / 1000) + "\n" +
                    "# clock_only " + std::to_string(clock_only_value()) + "\n");
  auto db = dblock::test::open_db(url, prefix, 2);
  id_generator gen(db, name, o);
  clock_only_generator naive;
  std::string buf, clock_buf;
  for (long long i = 0; i < count; ++i) {
    buf += std::to_string(gen.next());
    buf += '\n';
    clock_buf += std::to_string(naive.next());
    clock_buf += '\n';
    if ((i + 1) % 1000 == 0) {
      write_all(clock_fd, clock_buf);
      write_all(fd, buf);
      buf.clear();
      clock_buf.clear();
      if (pace_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pace_us));
    }
  }
  write_all(clock_fd, clock_buf + "# done\n");
  write_all(fd, buf + "# done\n");
  ::close(clock_fd);
  ::close(fd);
  return 0;
}

// ---- 1: unique and increasing, across generator objects and threads ---------------------------

DBLOCK_TEST("id_generator: unique IDs from two generators and 4 threads, blocks increase",
            "[id_generator]") {
  const std::string name = "orders-" + dblock::test::random_suffix();
  const std::int64_t block = 1000;
  const int per_thread = full_run() ? 100000 : 10000;
  id_generator_options o;
  o.block_size = block;
  // Two objects on the same name, each used by one thread (so its blocks can be checked for
  // order), and a third one shared by three threads (thread-safety).
  id_generator a(ctx.db, name, o), b(ctx.open(), name, o), shared(ctx.db, name, o);
  std::vector<std::vector<std::int64_t>> seen(5);
  std::vector<std::string> failures(5);
  std::vector<std::thread> threads;
  const auto before = std::chrono::system_clock::now();
  for (int t = 0; t < 5; ++t) {
    threads.emplace_back([&, t] {
      id_generator& g = t == 0 ? a : t == 1 ? b : shared;
      try {
        for (int i = 0; i < per_thread; ++i)
          seen[static_cast<std::size_t>(t)].push_back(g.next());
      } catch (const std::exception& e) {
        failures[static_cast<std::size_t>(t)] = e.what();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  const auto after = std::chrono::system_clock::now();
  for (const auto& f : failures)
    REQUIRE(f.empty());

  std::vector<std::int64_t> all;
  for (const auto& v : seen)
    all.insert(all.end(), v.begin(), v.end());
  REQUIRE(all.size() == 5u * per_thread);
  CHECK(duplicates(all).empty());
  CHECK(*std::min_element(all.begin(), all.end()) > 0);
  // One thread per object: whole blocks, each above the one before.
  CHECK(check_blocks(seen[0], block) == "");
  CHECK(check_blocks(seen[1], block) == "");
  // Within a block the order is shuffled (a block of 1000 in increasing order would be 0
  // descents; a random order has about 500).
  CHECK(descents(std::vector<std::int64_t>(seen[0].begin(), seen[0].begin() + block)) > 100);
  // The time part is the database clock (a local server, or this process for SQLite).
  for (std::int64_t id : {all.front(), all.back(), seen[0].back(), seen[1].back()}) {
    const auto t = id_generator::time_of(id);
    CHECK(t > before - std::chrono::seconds(5));
    CHECK(t < after + std::chrono::seconds(5));
  }
  // Counters: at most one round trip per block.
  const auto s = a.stats();
  CHECK(s.ids_issued == static_cast<std::uint64_t>(per_thread));
  CHECK(s.reservations >= 1);
  CHECK(s.reservations <= s.blocks_reserved);
  CHECK(s.ids_reserved == s.blocks_reserved * static_cast<std::uint64_t>(block));
  CHECK(s.ids_reserved >= s.ids_issued);
  INFO("a: " << s.reservations << " reservations, " << s.blocks_reserved << " blocks");
  CHECK(a.name() == name);
}

DBLOCK_TEST("id_generator: next(count), without prefetch, and blocks of one", "[id_generator]") {
  const std::string name = "batch-" + dblock::test::random_suffix();
  id_generator_options o;
  o.block_size = 7;
  o.prefetch = false;
  id_generator g(ctx.db, name, o);
  auto ids = g.next(100);
  REQUIRE(ids.size() == 100);
  CHECK(duplicates(ids).empty());
  CHECK(check_blocks(ids, 7) == "");
  o.block_size = 1;
  o.prefetch = true;
  id_generator one(ctx.db, name, o);
  auto more = one.next(50);
  CHECK(std::is_sorted(more.begin(), more.end()));
  more.insert(more.end(), ids.begin(), ids.end());
  CHECK(duplicates(more).empty());
  CHECK(one.stats().reservations <= 50);
}

// ---- 2: the row is never behind an issued ID --------------------------------------------------

DBLOCK_TEST("id_generator: the id_block row is above every issued ID", "[id_generator]") {
  const std::string name = "rows-" + dblock::test::random_suffix();
  CHECK(row_next_id(ctx, name) == -1);  // created by the first reservation
  id_generator_options o;
  o.block_size = 100;
  std::int64_t max_id = 0;
  {
    id_generator g(ctx.db, name, o);
    for (int i = 0; i < 2500; ++i)
      max_id = std::max(max_id, g.next());
    const long long row = row_next_id(ctx, name);
    CHECK(row >= max_id + 1);
    const auto s = g.stats();
    CHECK(s.ids_issued == 2500u);
    CHECK(s.ids_reserved >= 2500u);
  }
  // A new object on the same name starts above the row as left by the old one.
  const long long row = row_next_id(ctx, name);
  id_generator h(ctx.db, name, o);
  const std::int64_t id = h.next();
  CHECK(id >= row);
  CHECK(row_next_id(ctx, name) > id);
}

// ---- 3: a counter ahead of the clock (a clock that stepped back) -------------------------------

DBLOCK_TEST("id_generator: a counter an hour ahead of the clock still yields larger IDs",
            "[id_generator]") {
  const std::string name = "skew-" + dblock::test::random_suffix();
  id_generator_options o;
  o.block_size = 50;
  {
    id_generator g(ctx.db, name, o);
    g.next();
  }
  // As if IDs had been issued while the clock was an hour ahead, and the clock stepped back.
  const long long ahead = clock_only_value() + 3600LL * 1000 * id_generator::per_ms;
  ctx.exec("UPDATE " + ctx.table("id_block") + " SET next_id = " + std::to_string(ahead) +
           " WHERE generator = '" + name + "'");
  id_generator g(ctx.db, name, o);
  std::vector<std::int64_t> ids = g.next(500);
  for (std::int64_t id : ids)
    REQUIRE(id >= ahead);
  CHECK(duplicates(ids).empty());
  CHECK(row_next_id(ctx, name) > *std::max_element(ids.begin(), ids.end()));
  // The IDs follow the counter, not the clock: their time part is an hour ahead.
  CHECK(id_generator::time_of(ids.front()) >
        std::chrono::system_clock::now() + std::chrono::minutes(59));
  // Negative control of the two checks above: a generator of another name, whose row was not
  // moved, starts from the (database) clock: below `ahead`, in the range that may be in use
  // already, and with a time part of now.
  id_generator fresh(ctx.db, name + "-fresh", o);
  const std::int64_t from_clock = fresh.next();
  CHECK(from_clock < ahead);
  CHECK_FALSE(id_generator::time_of(from_clock) >
              std::chrono::system_clock::now() + std::chrono::minutes(59));
}

// ---- 4: bad input and errors --------------------------------------------------------------------

DBLOCK_TEST("id_generator: bad names and block sizes are invalid_argument", "[id_generator]") {
  auto message = [&](const std::string& name, std::int64_t block) -> std::string {
    id_generator_options o;
    o.block_size = block;
    try {
      id_generator g(ctx.db, name, o);
    } catch (const dblock::error& e) {
      return e.code() == errc::invalid_argument ? e.what() : "wrong code: " + std::string(e.what());
    }
    return "no error";
  };
  CHECK_THAT(message("", 1000), Catch::Contains("empty"));
  CHECK_THAT(message(std::string(256, 'x'), 1000), Catch::Contains("256 bytes"));
  CHECK_THAT(message(std::string("a\0b", 3), 1000), Catch::Contains("NUL"));
  CHECK_THAT(message("ok", 0), Catch::Contains("block_size 0 is outside 1 .. 4194304"));
  CHECK_THAT(message("ok", -5), Catch::Contains("block_size -5"));
  CHECK_THAT(message("ok", id_generator::per_ms + 1),
             Catch::Contains("block_size 4194305 is outside"));
  // The limits themselves are fine.
  CHECK(message(std::string(255, 'x'), id_generator::per_ms) == "no error");
  CHECK(message("ok", 1) == "no error");
}

DBLOCK_TEST("id_generator: an unmigrated schema is reported by next(), every time",
            "[id_generator]") {
  auto db = dblock::test::open_db(ctx.url, ctx.new_prefix(), 2);
  for (bool prefetch : {true, false}) {
    id_generator_options o;
    o.prefetch = prefetch;
    id_generator g(db, "nothing", o);
    CHECK(code_of([&] { g.next(); }) == errc::schema_missing);
    CHECK(code_of([&] { g.next(); }) == errc::schema_missing);  // tried again, not stuck
    CHECK(g.stats().ids_issued == 0);
  }
}

// ---- 5: 8 processes, kill -9 and restarts, one process an hour back ---------------------------

DBLOCK_TEST("id_generator: 8 processes with kill -9, restarts and a clock an hour back",
            "[id_generator][process]") {
  const std::string fake_lib = dblock::test::faketime_lib();
  if (fake_lib.empty())
    FAIL("libfaketime is missing: install the faketime package (scripts/install-deps.sh)");
  const long long n = full_run() ? 200000 : 20000;
  const int procs = 8;
  const std::string name = "proc-" + dblock::test::random_suffix();
  temp_dir dir("ids");
  process_set ps;
  auto spawn = [&](const std::string& file, long long count, long long pace_us,
                   const std::vector<std::string>& env = {}) {
    return ps.spawn("id_worker",
                    {ctx.url, ctx.prefix, name, std::to_string(count), "500",
                     std::to_string(pace_us), dir.file(file), std::to_string(now_ms())},
                    env);
  };
  // Workers 0 and 1 are paced (40 ms per 1000 IDs) so that they are surely killed mid-run: each
  // is killed as soon as it has written a quarter of its IDs, watched together (one after the
  // other, the second could finish while the first was being killed and reaped: seen under ASan).
  std::vector<int> pids;
  for (int p = 0; p < procs; ++p)
    pids.push_back(spawn("w" + std::to_string(p), n, p < 2 ? 40000 : 0));
  bool sent[2] = {false, false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!(sent[0] && sent[1]) && std::chrono::steady_clock::now() < deadline) {
    for (int p = 0; p < 2; ++p) {
      struct stat st {};
      const std::string f = dir.file("w" + std::to_string(p));
      // A quarter: 19 bytes a line, and headers.
      if (!sent[p] && ::stat(f.c_str(), &st) == 0 && st.st_size > n / 4 * 20) {
        ::kill(pids[static_cast<std::size_t>(p)], SIGKILL);
        sent[p] = true;
      }
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  int killed = 0;
  for (int p = 0; p < 2; ++p) {
    if (!sent[p]) ::kill(pids[static_cast<std::size_t>(p)], SIGKILL);
    killed += ps.wait(pids[static_cast<std::size_t>(p)], std::chrono::seconds(30)) == 128 + 9;
  }
  CHECK(killed == 2);
  // Restarts of the killed ones, and one more process whose clock is an hour back.
  std::vector<int> later;
  later.push_back(spawn("r0", n, 0));
  later.push_back(spawn("r1", n, 0));
  std::vector<std::string> fake_env = {std::string("LD_PRELOAD=") + fake_lib, "FAKETIME=-1h",
                                       "FAKETIME_DONT_FAKE_MONOTONIC=1"};
  if (!std::getenv("ASAN_OPTIONS")) fake_env.push_back("ASAN_OPTIONS=verify_asan_link_order=0");
  const int fake = spawn("fake", n, 0, fake_env);
  for (int p = 2; p < procs; ++p)
    CHECK(ps.wait(pids[static_cast<std::size_t>(p)], std::chrono::seconds(300)) == 0);
  for (int pid : later)
    CHECK(ps.wait(pid, std::chrono::seconds(300)) == 0);
  CHECK(ps.wait(fake, std::chrono::seconds(300)) == 0);

  std::vector<std::int64_t> all;
  std::size_t bad = 0;
  worker_output fake_out;
  std::vector<std::string> files = {"r0", "r1", "fake"};
  for (int p = 0; p < procs; ++p)
    files.push_back("w" + std::to_string(p));
  for (const auto& f : files) {
    auto o = parse_output(dblock::test::read_file(dir.file(f)));
    bad += o.bad_lines;
    INFO(f << ": " << o.ids.size() << " IDs");
    if (f == "w0" || f == "w1") {
      CHECK(o.ids.size() >= static_cast<std::size_t>(n / 4));  // killed mid-run
      CHECK(o.ids.size() < static_cast<std::size_t>(n));
    } else {
      CHECK(o.done);
      CHECK(o.ids.size() == static_cast<std::size_t>(n));
    }
    if (f == "fake") fake_out = o;
    all.insert(all.end(), o.ids.begin(), o.ids.end());
  }
  CHECK(bad == 0);
  const auto dups = duplicates(all);
  INFO(all.size() << " IDs in all, " << dups.size() << " duplicates");
  CHECK(dups.empty());
  // libfaketime was really applied: the clock of that process was an hour back.
  CHECK(fake_out.clock_offset_s <= -3590);
  CHECK(fake_out.clock_offset_s >= -3610);
  // The process whose clock was an hour back issued IDs above what its clock alone gives (on
  // SQLite, where the time part is this process's clock, the counter did that; on the servers the
  // time part is the database's clock).
  REQUIRE(fake_out.clock_only > 0);
  REQUIRE(!fake_out.ids.empty());
  CHECK(*std::min_element(fake_out.ids.begin(), fake_out.ids.end()) >
        fake_out.clock_only + 3500LL * 1000 * id_generator::per_ms);
  // Negative control: with every ID above, each process also made one ID with a clock-only
  // generator (clock_only_generator). Those are unique within each process, but the processes
  // issued some in the same milliseconds: they collide, the generator's IDs above do not.
  std::vector<std::int64_t> clock_ids;
  for (const auto& f : files) {
    auto o = parse_output(dblock::test::read_file(dir.file(f + ".clock")));
    INFO(f << ".clock: " << o.ids.size() << " clock-only IDs");
    CHECK(o.bad_lines == 0);
    CHECK(duplicates(o.ids).empty());
    if (f != "w0" && f != "w1") CHECK(o.ids.size() == static_cast<std::size_t>(n));
    clock_ids.insert(clock_ids.end(), o.ids.begin(), o.ids.end());
  }
  const auto clock_dups = duplicates(clock_ids);
  INFO(clock_ids.size() << " clock-only IDs from " << files.size() << " processes, "
                        << clock_dups.size() << " duplicates");
  CHECK(clock_dups.size() > 0);
}

// ---- 6: the CLI
// ----------------------------------------------------------------------------------

namespace {

struct cli_run {
  int status = -1;
  std::string out;
  std::string err;
};

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

cli_run run_cli(const std::string& args, const std::string& err_file) {
  cli_run r;
  const std::string cmd = std::string(DBLOCK_CLI_PATH) + " " + args + " 2>" + quote(err_file);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), p)) > 0)
    r.out.append(buf.data(), got);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.err = dblock::test::read_file(err_file);
  return r;
}

}  // namespace

DBLOCK_TEST("cli id: prints --count distinct increasing IDs; bad arguments exit 64",
            "[id_generator][cli]") {
  temp_dir dir("idcli");
  const std::string err = dir.file("err");
  const std::string common = "--url " + quote(ctx.url) + " --table-prefix " + ctx.prefix;
  auto r = run_cli("id " + common + " --count 5", err);
  INFO(r.out << r.err);
  REQUIRE(r.status == 0);
  auto o = parse_output(r.out);
  CHECK(o.bad_lines == 0);
  REQUIRE(o.ids.size() == 5);
  // --count 5 reserves one block of 5 and hands it out shuffled: distinct, in one block.
  CHECK(duplicates(o.ids).empty());
  CHECK(check_blocks(o.ids, 5) == "");
  CHECK(row_next_id(ctx, "default") > *std::max_element(o.ids.begin(), o.ids.end()));
  // A second run continues above the first; --block-size 1 hands them out in order.
  auto r2 = run_cli("id " + common + " --count 5 --block-size 1", err);
  REQUIRE(r2.status == 0);
  auto o2 = parse_output(r2.out);
  REQUIRE(o2.ids.size() == 5);
  CHECK(std::is_sorted(o2.ids.begin(), o2.ids.end()));
  CHECK(duplicates(o2.ids).empty());
  CHECK(o2.ids.front() > *std::max_element(o.ids.begin(), o.ids.end()));
  // Another name has its own row.
  auto r3 = run_cli("id " + common + " --name invoices --count 3000", err);
  REQUIRE(r3.status == 0);
  auto o3 = parse_output(r3.out);
  CHECK(o3.ids.size() == 3000);
  CHECK(duplicates(o3.ids).empty());
  CHECK(row_next_id(ctx, "invoices") > 0);

  for (const char* bad : {"--count 0", "--count abc", "--count -3", "--block-size 0",
                          "--block-size 4194305", "--name ''"}) {
    auto b = run_cli("id " + common + " " + bad, err);
    INFO(bad << ": " << b.out << b.err);
    CHECK(b.status == 64);  // EX_USAGE
    CHECK(b.out.empty());
  }
}

// ---- throughput: hidden (run with "[id_generator_bench]"); prints, asserts nothing ------------

DBLOCK_TEST("id_generator: throughput of next() on one thread, blocks of 1000",
            "[.][id_generator_bench]") {
  const long long n = full_run() ? 20000000 : 5000000;
  id_generator g(ctx.db, "bench-" + dblock::test::random_suffix());
  g.next();  // the first reservation (and the row) outside the measurement
  std::int64_t sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (long long i = 0; i < n; ++i)
    sink ^= g.next();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto st = g.stats();
  WARN(ctx.backend << ": " << n << " IDs in " << s
                   << " s = " << static_cast<long long>(static_cast<double>(n) / s) << " IDs/s; "
                   << st.reservations << " reservations for " << st.blocks_reserved << " blocks, "
                   << st.waits << " waits (checksum " << sink << ")");
  // Paced at 1,000,000 IDs/s for a second: with prefetch, next() should (almost) never wait.
  id_generator p(ctx.db, "paced-" + dblock::test::random_suffix());
  const long long m = 1000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long long i = 0; i < m; ++i) {
    if (i % 1000 == 0)
      while (std::chrono::steady_clock::now() - t0 < std::chrono::microseconds(i)) {
      }
    sink ^= p.next();
  }
  const auto sp = p.stats();
  WARN(ctx.backend << " paced at 1M IDs/s: " << sp.reservations << " reservations for "
                   << sp.blocks_reserved << " blocks, " << sp.waits << " waits (" << sink << ")");
}
