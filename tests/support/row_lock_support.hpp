// Shared by the row-lock tests (row_lock_*_test.cpp): database helpers, the outcome of a call that
// may block, and a barrier for threads.
//
// A call that should return quickly but may block on a library bug is run on a helper thread
// with a deadline (run_bounded): past the deadline the test records the failure and releases the
// lock the call waits for, so that a bug costs seconds, never the server's 50 s lock wait.
#pragma once

#include <soci/soci.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "harness.hpp"

namespace dblock::test::rowlock {

// The names every row-lock test uses (`using namespace dblock::test::rowlock` brings them in).
using dblock::lock_wait;
using dblock::row_selector;
using dblock::transaction;
using dblock::transaction_options;

inline double ms_since(long long t0_ns) {
  return static_cast<double>(monotonic_ns() - t0_ns) / 1e6;
}

// One line per measurement, easy to grep out of a run.
inline void metric(const std::string& backend, const std::string& text) {
  std::cerr << "[rowlock-metric] " << backend << ": " << text << std::endl;
}

// ---- database helpers --------------------------------------------------------------------------

inline long long query_ll(const dblock::database& db, const std::string& sql) {
  auto c = db.connect();
  long long n = -1;
  c.session() << sql, soci::into(n);
  return n;
}

inline long long count_rows(const dblock::database& db, const std::string& table,
                            const std::string& where = "1 = 1") {
  return query_ll(db, "SELECT count(*) FROM " + table + " WHERE " + where);
}

inline long long lock_rows_for(const dblock::database& db, const std::string& name) {
  auto c = db.connect();
  long long n = -1;
  c.session() << "SELECT count(*) FROM " << db.lock_table() << " WHERE resource_name = :n",
      soci::use(name), soci::into(n);
  return n;
}

// Opens every pooled connection now, so that measured calls do not pay for connecting.
inline void warm_pool(const dblock::database& db, std::size_t n) {
  std::vector<dblock::database::connection> cs;
  for (std::size_t i = 0; i < n; ++i)
    cs.push_back(db.connect());
}

inline long long as_int(const dblock::value& v) {
  if (auto* i = std::get_if<long long>(&v)) return *i;
  if (auto* s = std::get_if<std::string>(&v)) return std::stoll(*s);
  if (auto* d = std::get_if<double>(&v)) return static_cast<long long>(*d);
  throw std::runtime_error("NULL where an integer was expected");
}

inline std::string as_text(const dblock::value& v) {
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  if (auto* i = std::get_if<long long>(&v)) return std::to_string(*i);
  return "<null>";
}

inline void create_items(const dblock::test::context& ctx, long long stock, int n_items = 1) {
  ctx.exec("CREATE TABLE " + ctx.table("items") +
           " (item_id INTEGER PRIMARY KEY, stock INTEGER NOT NULL)");
  for (int i = 1; i <= n_items; ++i)
    ctx.exec("INSERT INTO " + ctx.table("items") + " (item_id, stock) VALUES (" +
             std::to_string(i) + ", " + std::to_string(stock) + ")");
}

inline long long read_stock(const dblock::database& db, const std::string& table,
                            long long id = 1) {
  return query_ll(db, "SELECT stock FROM " + table + " WHERE item_id = " + std::to_string(id));
}

inline row_selector item(const std::string& table, long long id = 1) {
  return row_selector{table, "item_id", id, {"stock"}};
}

// ---- outcomes of calls that may block --------------------------------------------------------

struct outcome {
  bool acquired = false;           // a lock was obtained (and released again by the probe)
  std::optional<errc> code;        // set when the call threw dblock::error
  std::string message;             // what() of any exception
  bool foreign_exception = false;  // threw something other than dblock::error
  double ms = 0;                   // duration of the call
  bool in_time = true;             // returned before run_bounded's limit
  long long end_ns = 0;            // CLOCK_MONOTONIC when the call returned
};

// Calls f (which returns true when it obtained a lock) and records how it ended.
inline outcome timed(const std::function<bool()>& f) {
  outcome o;
  long long t0 = monotonic_ns();
  try {
    o.acquired = f();
  } catch (const dblock::error& e) {
    o.code = e.kind();
    o.message = e.what();
  } catch (const std::exception& e) {
    o.foreign_exception = true;
    o.message = e.what();
  }
  o.end_ns = monotonic_ns();
  o.ms = static_cast<double>(o.end_ns - t0) / 1e6;
  return o;
}

// Runs f on another thread and waits up to `limit`. When it has not returned by then, calls
// `unblock` (which must make it return, e.g. by releasing the lock it waits for) and waits for it.
inline outcome run_bounded(const std::function<bool()>& f, milliseconds limit,
                           const std::function<void()>& unblock) {
  auto fut = std::async(std::launch::async, [f] { return timed(f); });
  if (fut.wait_for(limit) == std::future_status::ready) return fut.get();
  unblock();
  outcome o = fut.get();
  o.in_time = false;
  return o;
}

inline std::string describe(const outcome& o) {
  std::ostringstream s;
  s << (o.acquired ? "acquired" : "not acquired") << " after " << o.ms << " ms";
  if (o.code) s << ", error " << dblock::to_string(*o.code);
  if (o.foreign_exception) s << ", non-dblock exception";
  if (!o.message.empty()) s << " (" << o.message << ")";
  if (!o.in_time) s << " [did not return in time: the test released the lock to unblock it]";
  return s.str();
}

// try_lock_resource as a probe: true when it got the lock (released again at once).
inline std::function<bool()> try_resource(const dblock::database& db, const std::string& name) {
  return [db, name] {
    auto t = dblock::try_lock_resource(db, name);
    if (!t) return false;
    t->rollback();
    return true;
  };
}

// A cyclic barrier for threads, with a timeout so that a broken test cannot hang.
class rendezvous {
 public:
  explicit rendezvous(int parties) : parties_(parties) {}
  bool arrive_and_wait(milliseconds timeout = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lk(mu_);
    long gen = generation_;
    if (++waiting_ == parties_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
      return true;
    }
    return cv_.wait_for(lk, timeout, [&] { return generation_ != gen; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int parties_;
  int waiting_ = 0;
  long generation_ = 0;
};

// Runs `threads` threads over `names`: before each name every thread meets the others at `start`,
// then calls attempt(thread, name index). Returns each thread's first error as "<name>: <what>"
// ("" when none).
inline std::vector<std::string> all_threads_on_each_name(
    rendezvous& start, int threads, const std::vector<std::string>& names,
    const std::function<void(int, int)>& attempt) {
  std::vector<std::string> errors(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < static_cast<int>(names.size()); ++i) {
        start.arrive_and_wait();  // everyone hits the same name at the same moment
        try {
          attempt(t, i);
        } catch (const std::exception& e) {
          if (errors[t].empty()) errors[t] = names[i] + ": " + e.what();
        }
      }
    });
  for (auto& t : ts)
    t.join();
  return errors;
}

}  // namespace dblock::test::rowlock
