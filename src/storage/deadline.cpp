// Call deadlines and the sentinel that enforces them (see deadline.hpp).
#include "storage/deadline.hpp"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <new>
#include <thread>

namespace dblock::detail {

namespace {

struct thread_deadline {
  bool set = false;
  deadline_clock::time_point until{};
  std::string what;
  bool extended = false;  // resolution_time moved it once
};

thread_local thread_deadline tl;

std::atomic<bool> enforced{true};
std::atomic<long long> fired_total{0};

}  // namespace

struct armed_connection::entry {
  deadline_clock::time_point until;
  std::unique_ptr<interrupter> target;
  std::string what;
  int stage = 0;        // 0: waiting for the deadline; 1: cancel sent; 2: cut
  bool queued = false;  // in the sentinel's schedule (under its mutex)
  std::multimap<deadline_clock::time_point, std::shared_ptr<entry>>::iterator at;
  std::atomic<bool> fired{false};
};

namespace {

// One thread per process, started with the first armed connection. Never destroyed (a
// detached cancel may outlive main()); replaced in a forked child, which has no such thread.
class sentinel {
 public:
  static sentinel& get() {
    static std::once_flag once;
    std::call_once(once, [] {
      instance = new (storage) sentinel();
      // The child's: a new one over the old (locked, and its thread gone), built in place. A
      // forked child must not allocate: another thread of the parent may have held an
      // allocator's lock at the fork (seen under ASan: a `dblock exec` child spun for ever).
      pthread_atfork([] { instance->mu_.lock(); }, [] { instance->mu_.unlock(); },
                     [] { instance = new (storage) sentinel(); });
    });
    return *instance;
  }

  void schedule(const std::shared_ptr<armed_connection::entry>& e) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!started_) {
      std::thread([this] { loop(); }).detach();
      started_ = true;
    }
    e->at = due_.emplace(e->until, e);
    e->queued = true;
    // Woken only when this deadline comes before the time it sleeps until: most calls arm a
    // deadline later than one already scheduled (and disarm long before it), and a wake-up per
    // call would cost every call a context switch.
    if (e->until < wake_at_) cv_.notify_one();
  }

  void remove(armed_connection::entry& e) {
    std::lock_guard<std::mutex> lk(mu_);
    if (e.queued) due_.erase(e.at);
    e.queued = false;
    e.stage = 3;  // done: never acted on again
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (due_.empty()) {
        wake_at_ = deadline_clock::time_point::max();
        cv_.wait(lk);
        wake_at_ = deadline_clock::time_point::min();
        continue;
      }
      const auto t = due_.begin()->first;
      const auto now = deadline_clock::now();
      if (now < t) {
        // At most an hour at a time: a far deadline never overflows the wait's conversions.
        wake_at_ = std::min(t, now + std::chrono::hours(1));
        cv_.wait_until(lk, wake_at_);
        wake_at_ = deadline_clock::time_point::min();
        continue;
      }
      auto e = due_.begin()->second;
      due_.erase(due_.begin());
      e->queued = false;
      if (!enforced.load()) continue;
      if (e->stage == 0) {
        e->stage = 1;
        e->fired.store(true);
        fired_total.fetch_add(1);
        if (auto c = e->target->cancel()) {
          try {
            std::thread(std::move(c)).detach();
          } catch (...) {  // no thread: the cut below still ends the wait
          }
        }
        e->at = due_.emplace(t + cut_grace, e);
        e->queued = true;
      } else if (e->stage == 1) {
        e->stage = 2;
        e->target->cut();
      }
    }
  }

  static sentinel* instance;
  static unsigned char storage[];  // where the process's sentinel is built (never destroyed)
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<deadline_clock::time_point, std::shared_ptr<armed_connection::entry>> due_;
  /// When the sentinel wakes by itself (max: not before it is notified; min: it is awake).
  /// Under mu_.
  deadline_clock::time_point wake_at_ = deadline_clock::time_point::max();
  bool started_ = false;
};

sentinel* sentinel::instance = nullptr;
alignas(sentinel) unsigned char sentinel::storage[sizeof(sentinel)];

}  // namespace

call_deadline::call_deadline(deadline_clock::time_point until, std::string what)
    : prev_{tl.set, tl.until, tl.what, tl.extended} {
  // A bound past a century is none.
  if (until - deadline_clock::now() >= std::chrono::hours(24 * 365 * 100)) return;
  if (!tl.set || until < tl.until) {
    tl.set = true;
    tl.until = until;
    tl.what = std::move(what);
  }
}

std::string wait_text(deadline_clock::time_point start, deadline_clock::time_point deadline) {
  if (deadline == deadline_clock::time_point::max()) return "no end";
  if (deadline <= start) return "0 ms";
  return std::to_string(std::chrono::ceil<std::chrono::milliseconds>(deadline - start).count()) +
         " ms";
}

call_deadline::call_deadline(std::chrono::milliseconds d, std::string what)
    : prev_{tl.set, tl.until, tl.what, tl.extended} {
  const auto now = deadline_clock::now();
  // A bound past a century is none (and now + max() would overflow).
  if (d >= std::chrono::hours(24 * 365 * 100)) return;
  const auto until = now + std::max(d, std::chrono::milliseconds(0));
  if (!tl.set || until < tl.until) {
    tl.set = true;
    tl.until = until;
    tl.what = std::move(what);
  }
}

call_deadline::~call_deadline() {
  tl.set = prev_.set;
  tl.until = prev_.until;
  tl.what = std::move(prev_.what);
  tl.extended = prev_.extended;
}

std::optional<deadline_clock::time_point> call_deadline::current() noexcept {
  if (!tl.set) return std::nullopt;
  return tl.until;
}

std::string call_deadline::current_what() {
  return tl.set ? tl.what : std::string();
}

std::optional<std::chrono::milliseconds> call_deadline::left() noexcept {
  if (!tl.set) return std::nullopt;
  const auto d = tl.until - deadline_clock::now();
  if (d.count() <= 0) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(d) + std::chrono::milliseconds(1);
}

resolution_time::resolution_time() {
  if (!tl.set || tl.extended) return;
  const auto now = deadline_clock::now();
  if (now + resolve_grace <= tl.until) return;  // time enough left
  // The outer deadline is saved by call_deadline and restored when this ends; in between the
  // thread's deadline is later than the outer one, so set it directly.
  const std::string what = tl.what;
  inner_.emplace(tl.until, what);  // saves the outer state
  tl.until = std::max(tl.until, now) + resolve_grace;
  tl.what = what + " (and " + std::to_string(resolve_grace.count()) +
            " ms to resolve an unknown outcome)";
  tl.extended = true;
}

resolution_time::~resolution_time() = default;

void armed_connection::arm(deadline_clock::time_point until, std::unique_ptr<interrupter> target,
                           std::string what) {
  disarm();
  auto e = std::make_shared<entry>();
  e->until = until;
  e->target = std::move(target);
  e->what = std::move(what);
  e_ = e;
  sentinel::get().schedule(e);
}

void armed_connection::disarm() noexcept {
  if (e_) sentinel::get().remove(*e_);
}

bool armed_connection::fired() const noexcept {
  return e_ && e_->fired.load();
}

std::string armed_connection::cause() const {
  if (!e_) return {};
  return "the database did not answer within " + e_->what;
}

std::optional<deadline_clock::time_point> armed_connection::until() const noexcept {
  if (!e_) return std::nullopt;
  return e_->until;
}

void set_deadlines_enforced(bool on) noexcept {
  enforced.store(on);
}

long long deadlines_fired() noexcept {
  return fired_total.load();
}

}  // namespace dblock::detail
