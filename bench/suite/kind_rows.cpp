// The coordination kinds' rows: a semaphore's permit and a read-write lock's two sides, each as a
// ratio to the lease cycle (dblock.lease).
#include <dblock/dblock.hpp>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rows.hpp"

namespace dblock::bench {
namespace {

// Semaphores: a permit's try_acquire()+release() as a ratio to the lease cycle, with 0, 10 and
// 100 of the semaphore's 101 permits held meanwhile (each client its own semaphore). With a
// free permit a try is one upsert; the more are held, the likelier its first probe meets a
// held one and reads which are free.
void add_semaphore_rows(std::vector<row>& ops) {
  auto semaphore_op = [](int held) {
    return [held](backend_ctx& b, int t) {
      struct state {
        std::unique_ptr<dblock::semaphore> sem;
        std::vector<dblock::lease_guard> held;  // released when the measurement ends
      };
      auto st = std::make_shared<state>();
      const std::string name = "bench/sem/" + std::to_string(held) + "/" + std::to_string(t);
      dblock::lease_options lo;
      lo.ttl = std::chrono::minutes(10);
      st->sem = std::make_unique<dblock::semaphore>(b.db, name, 101, lo);
      for (int tries = 0; static_cast<int>(st->held.size()) < held; ++tries) {
        if (tries > 3 * held + 10)
          throw std::runtime_error("semaphore '" + name + "': cannot hold " + std::to_string(held) +
                                   " permits (left over from a crash? "
                                   "they expire within 10 minutes)");
        if (auto g = st->sem->try_acquire()) st->held.push_back(std::move(*g));
      }
      return cycle_fn([st] {
        auto g = st->sem->try_acquire();
        if (!g) return false;
        g->release();
        return true;
      });
    };
  };
  ops.push_back({"dblock.semaphore", "feature", "dblock.lease",
                 "semaphore (101 permits, none held): try_acquire()+release() of a permit; "
                 "ratio to dblock.lease",
                 semaphore_op(0)});
  ops.push_back({"dblock.semaphore_held10", "feature", "dblock.lease",
                 "the same with 10 of the 101 permits held", semaphore_op(10)});
  ops.push_back({"dblock.semaphore_held100", "feature", "dblock.lease",
                 "the same with 100 of the 101 permits held", semaphore_op(100)});
}

// Read-write locks: a reader's try_lock_shared()+release() (three statements: take a reader
// row, read the writer row, release) with 0, 10 and 100 other readers in, and a writer's
// try_lock()+release() with no reader in (take, read the reader rows, release), as ratios to
// the lease cycle (two statements). Each client has its own lock.
void add_rwlock_rows(std::vector<row>& ops) {
  auto rwlock_op = [](bool write, int others) {
    return [write, others](backend_ctx& b, int t) {
      struct state {
        std::unique_ptr<dblock::rwlock> lock;
        std::vector<dblock::rwlock> other_locks;
        std::vector<dblock::lease_guard> held;  // the other readers, released at the end
      };
      auto st = std::make_shared<state>();
      const std::string name = std::string("bench/rw/") + (write ? "w/" : "r/") +
                               std::to_string(others) + "/" + std::to_string(t);
      dblock::lease_options lo;
      lo.ttl = std::chrono::minutes(10);
      st->lock = std::make_unique<dblock::rwlock>(b.db, name, lo);
      for (int k = 0; k < others; ++k) {
        st->other_locks.emplace_back(b.db, name, lo);
        auto g = st->other_locks.back().try_acquire_shared();
        if (!g)
          throw std::runtime_error("read-write lock '" + name +
                                   "': cannot admit the other readers (left over from a crash? "
                                   "they expire within 10 minutes)");
        st->held.push_back(std::move(*g));
      }
      return cycle_fn([st, write] {
        auto g = write ? st->lock->try_acquire() : st->lock->try_acquire_shared();
        if (!g) return false;
        g->release();
        return true;
      });
    };
  };
  ops.push_back({"dblock.read_lock", "feature", "dblock.lease",
                 "read-write lock, no other reader: try_lock_shared()+release(); ratio to "
                 "dblock.lease",
                 rwlock_op(false, 0)});
  ops.push_back({"dblock.read_lock_held10", "feature", "dblock.lease",
                 "the same with 10 other readers in", rwlock_op(false, 10)});
  ops.push_back({"dblock.read_lock_held100", "feature", "dblock.lease",
                 "the same with 100 other readers in", rwlock_op(false, 100)});
  ops.push_back({"dblock.write_lock", "feature", "dblock.lease",
                 "read-write lock, no reader in: try_lock()+release(); ratio to dblock.lease",
                 rwlock_op(true, 0)});
}

}  // namespace

std::vector<row> kind_rows(backend_ctx&, const options&) {
  std::vector<row> ops;
  add_semaphore_rows(ops);
  add_rwlock_rows(ops);
  return ops;
}

}  // namespace dblock::bench
