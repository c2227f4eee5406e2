// The ID generator: blocks of IDs reserved with one atomic UPDATE of the id_block row (see
// storage/counter_tables.hpp), handed out in a per-block pseudo-random order, the next blocks
// reserved by a background thread while the current one is still in use.
#include "dblock/id_generator.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

#include "core/identifier.hpp"
#include "storage/counter_tables.hpp"
#include "storage/session.hpp"
#include "storage/write_scope.hpp"

namespace dblock {
namespace detail {
namespace {

using steady = std::chrono::steady_clock;

constexpr std::int64_t max_blocks_per_reservation = 64;
// Blocks used up faster than one per this interval make the next reservation larger.
constexpr auto fast_block = std::chrono::milliseconds(10);
// Blocks used up slower than one per this interval make it smaller again.
constexpr auto slow_block = std::chrono::milliseconds(200);

// splitmix64's finaliser: the round function of the Feistel network.
std::uint64_t mix(std::uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A block [base, base + size) and a keyed permutation of its offsets: a 4-round Feistel network
// on the smallest even number of bits that covers `size`, with cycle walking (apply it again
// until the result falls inside the block). At most 4 times the domain of the block, so the
// expected number of walks is below 4.
struct block {
  std::int64_t base = 0;
  std::int64_t size = 0;
  std::int64_t used = 0;
  int half_bits = 1;
  std::uint64_t keys[4] = {0, 0, 0, 0};

  block() = default;
  block(std::int64_t b, std::int64_t n, std::mt19937_64& rng) : base(b), size(n) {
    int bits = 0;
    while ((std::int64_t{1} << bits) < n)
      ++bits;
    half_bits = std::max(1, (bits + 1) / 2);
    for (auto& k : keys)
      k = rng();
  }

  std::int64_t left() const noexcept { return size - used; }

  std::uint64_t permute(std::uint64_t x) const noexcept {
    const std::uint64_t mask = (std::uint64_t{1} << half_bits) - 1;
    std::uint64_t l = x >> half_bits, r = x & mask;
    for (std::uint64_t k : keys) {
      const std::uint64_t t = l ^ (mix(r ^ k) & mask);
      l = r;
      r = t;
    }
    return (l << half_bits) | r;
  }

  // The next ID of the block (left() > 0).
  std::int64_t take() noexcept {
    std::uint64_t x = static_cast<std::uint64_t>(used++);
    do {
      x = permute(x);
    } while (x >= static_cast<std::uint64_t>(size));
    return base + static_cast<std::int64_t>(x);
  }
};

// One reservation: `count` consecutive blocks starting at `first`.
struct reservation {
  std::int64_t first = 0;
  std::int64_t count = 0;
};

}  // namespace

struct id_generator_state {
  database db;
  std::string name;
  id_generator_options options;

  mutable std::mutex m;
  std::condition_variable work_cv;   // the worker waits here for a request or stop
  std::condition_variable ready_cv;  // next() waits here for blocks, an error, or a free fetcher
  block current;
  std::deque<std::int64_t> ready;  // bases of reserved blocks not yet started, increasing
  std::exception_ptr failed;       // of the last background reservation, until reported
  bool requested = false;          // the worker is asked to reserve
  bool fetching = false;           // a reservation is in flight (worker or caller)
  bool stop = false;
  std::thread worker;
  std::mt19937_64 rng{std::random_device{}()};
  id_generator_stats stats;
  std::int64_t last_count = 1;  // blocks of the last reservation

  // Adaptive batch; touched only by the one thread that has `fetching` set.
  std::int64_t blocks_next = 1;
  std::int64_t blocks_last = 0;
  steady::time_point last_start{};

  id_generator_state(database d, std::string n, id_generator_options o)
      : db(std::move(d)), name(std::move(n)), options(o) {}

  // How many blocks the next reservation takes: doubles while the blocks of the previous one
  // were used up faster than one per fast_block, halves when slower than one per slow_block.
  std::int64_t blocks_for_next(steady::time_point now) {
    if (blocks_last > 0) {
      const auto dt = now - last_start;
      if (dt < fast_block * blocks_last)
        blocks_next = std::min(max_blocks_per_reservation, blocks_last * 2);
      else if (dt > slow_block * blocks_last)
        blocks_next = std::max<std::int64_t>(1, blocks_last / 2);
      else
        blocks_next = blocks_last;
    }
    return blocks_next;
  }

  // One reservation round trip (two when the row does not exist yet). Called without the lock,
  // by the one thread that set `fetching`.
  reservation reserve() {
    const auto now = steady::now();
    const std::int64_t k = blocks_for_next(now);
    const std::int64_t n = k * options.block_size;
    const auto& impl = access::impl(db);
    auto once = [&]() -> std::optional<std::int64_t> {
      return with_session(impl, "reserve IDs", [&](session_scope& s) {
        write_scope w(s, write_kind::statement, "reserve IDs");
        auto r = id_table::reserve(s, name, id_generator::epoch_ms, id_generator::per_ms, n);
        w.commit();
        return r;
      });
    };
    auto end = once();
    if (!end) {
      with_session(impl, "create the ID generator's row", [&](session_scope& s) {
        write_scope w(s, write_kind::statement, "create the ID generator's row");
        id_table::ensure(s, name);
        w.commit();
      });
      end = once();
      if (!end)
        throw error(errc::backend_error, "reserve IDs for '" + name +
                                             "': the generator's row is missing right after it "
                                             "was created");
    }
    if (*end - n < 0)
      throw error(errc::backend_error, "reserve IDs for '" + name + "': the database returned " +
                                           std::to_string(*end) + " as the end of " +
                                           std::to_string(n) + " IDs");
    blocks_last = k;
    last_start = now;
    return reservation{*end - n, k};
  }

  // Files a reservation under the lock.
  void add(const reservation& r) {
    for (std::int64_t i = 0; i < r.count; ++i)
      ready.push_back(r.first + i * options.block_size);
    last_count = r.count;
    stats.reservations += 1;
    stats.blocks_reserved += static_cast<std::uint64_t>(r.count);
    stats.ids_reserved += static_cast<std::uint64_t>(r.count * options.block_size);
  }

  // reserve(), its error returned in `e` instead of thrown (an empty reservation then).
  reservation reserve_or(std::exception_ptr& e) noexcept {
    try {
      return reserve();
    } catch (...) {
      e = std::current_exception();
      return {};
    }
  }

  // One reservation with the lock released meanwhile (lock held on entry and exit): its blocks
  // are added, or its error returned; waiters are woken either way.
  std::exception_ptr fetch(std::unique_lock<std::mutex>& lk) {
    fetching = true;
    lk.unlock();
    std::exception_ptr e;
    const reservation r = reserve_or(e);
    lk.lock();
    fetching = false;
    if (!e) add(r);
    ready_cv.notify_all();
    return e;
  }

  void run_worker() {
    std::unique_lock<std::mutex> lk(m);
    for (;;) {
      work_cv.wait(lk, [&] { return stop || requested; });
      if (stop) return;
      requested = false;
      if (auto e = fetch(lk)) failed = e;
    }
  }

  // Asks the worker for a reservation unless one is asked for or in flight (lock held).
  void request_locked() {
    if (requested || fetching) return;
    if (!worker.joinable()) worker = std::thread([this] { run_worker(); });
    requested = true;
    work_cv.notify_one();
  }

  // Makes `current` non-empty (lock held; may release it while waiting or reserving).
  void refill(std::unique_lock<std::mutex>& lk) {
    bool waited = false;
    auto count_wait = [&] {
      if (!waited) ++stats.waits;
      waited = true;
    };
    while (current.left() == 0) {
      if (!ready.empty()) {
        current = block(ready.front(), options.block_size, rng);
        ready.pop_front();
        break;
      }
      if (failed) {
        auto e = std::exchange(failed, nullptr);
        std::rethrow_exception(e);
      }
      count_wait();
      if (options.prefetch) {
        request_locked();
        ready_cv.wait(lk);
        continue;
      }
      if (fetching) {
        ready_cv.wait(lk);
        continue;
      }
      if (auto e = fetch(lk)) std::rethrow_exception(e);
    }
  }

  // The next ID (lock held).
  std::int64_t take(std::unique_lock<std::mutex>& lk) {
    if (current.left() == 0) refill(lk);
    const std::int64_t id = current.take();
    ++stats.ids_issued;
    // Prefetch: half of the last reservation is used and nothing else is on the way.
    if (options.prefetch && !failed &&
        (static_cast<std::int64_t>(ready.size()) * options.block_size + current.left()) * 2 <=
            last_count * options.block_size)
      request_locked();
    return id;
  }
};

}  // namespace detail

id_generator::id_generator(database db, std::string name, id_generator_options options) {
  try {
    detail::validate_resource_name(name);
  } catch (const error& e) {
    throw error(errc::invalid_argument, std::string("id_generator: ") + e.what());
  }
  if (options.block_size < 1 || options.block_size > per_ms)
    throw error(errc::invalid_argument, "id_generator '" + name + "': block_size " +
                                            std::to_string(options.block_size) +
                                            " is outside 1 .. " + std::to_string(per_ms));
  s_ = std::make_unique<detail::id_generator_state>(std::move(db), std::move(name), options);
}

id_generator::~id_generator() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lk(s_->m);
    s_->stop = true;
    t = std::move(s_->worker);
  }
  s_->work_cv.notify_all();
  if (t.joinable()) t.join();
}

std::int64_t id_generator::next() {
  std::unique_lock<std::mutex> lk(s_->m);
  return s_->take(lk);
}

std::vector<std::int64_t> id_generator::next(std::size_t count) {
  std::vector<std::int64_t> out;
  out.reserve(count);
  std::unique_lock<std::mutex> lk(s_->m);
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(s_->take(lk));
  return out;
}

std::chrono::system_clock::time_point id_generator::time_of(std::int64_t id) noexcept {
  return std::chrono::system_clock::time_point(
      std::chrono::milliseconds(epoch_ms + (id >> sequence_bits)));
}

id_generator_stats id_generator::stats() const {
  std::lock_guard<std::mutex> lk(s_->m);
  return s_->stats;
}

const std::string& id_generator::name() const noexcept {
  return s_->name;
}

const id_generator_options& id_generator::options() const noexcept {
  return s_->options;
}

}  // namespace dblock
