// dblock: distributed locks and safe concurrent updates on the database you already run.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dblock/database.hpp"
#include "dblock/error.hpp"

/// @file
/// @brief Unique, roughly time-ordered 63-bit IDs from the database: dblock::id_generator.

namespace dblock {

namespace detail {
struct id_generator_state;
}  // namespace detail

/// Settings of an ID generator; id_generator's constructor checks them.
/// Thread-safety: a plain value.
struct id_generator_options {
  /// IDs per block, 1 .. 2^22 (4,194,304). A block is the unit handed out in a random order,
  /// and the unit of reservation: one round trip reserves one block or, under load, several.
  std::int64_t block_size = 1000;
  /// Reserve the next block(s) from a background thread once the current block is half used, so
  /// that next() does not wait on a round trip in the steady state. Without it, the next() that
  /// finds the block used up reserves the next one itself.
  bool prefetch = true;
};

/// Counters of one id_generator object since its construction.
/// Thread-safety: a plain value.
struct id_generator_stats {
  std::uint64_t reservations = 0;     ///< reserving round trips that succeeded
  std::uint64_t blocks_reserved = 0;  ///< blocks they reserved (>= reservations)
  std::uint64_t ids_reserved = 0;     ///< IDs they reserved (blocks_reserved * block_size)
  std::uint64_t ids_issued = 0;       ///< IDs returned by next()
  /// Times a next() call found no reserved ID left and waited for a round trip (with prefetch,
  /// only the first call and bursts that outrun the reservations).
  std::uint64_t waits = 0;
};

/**
 * @brief Unique 63-bit positive IDs, reserved from the database in blocks.
 *
 * An ID is `(ms since 2024-01-01T00:00:00Z) << 22 | sequence`: the high 41 bits are a
 * millisecond (good until about 2093), the low 22 bits a sequence within it. Each generator name
 * has one row in the `id_block` table holding the next free value; a reservation of n IDs is one
 * atomic UPDATE on the database clock:
 *
 *     next_id = max(next_id, (db_now_ms - epoch_ms) << 22) + n
 *
 * which returns [next_id - n, next_id) to this caller alone. The counter never goes down, so a
 * clock that steps back (on the database host, or on the client: the client clock is never
 * used) never produces a duplicate; IDs just stop following the clock until it catches up. More
 * than 2^22 (about 4.19 million) IDs in one millisecond likewise run the counter ahead of the
 * clock, still unique and increasing. On SQLite the "database clock" is the clock of the process
 * that runs the statement; the guarantee of uniqueness does not depend on it either.
 *
 * Order: IDs are unique across every process and generator object that uses the same name on
 * the same database. Blocks are increasing: every ID of a later block of a generator object is
 * greater than every ID of its earlier blocks, so IDs are roughly time-ordered (k-sorted) and
 * time_of() tells when their block was reserved; within a block the IDs come in a random order.
 *
 * What an ID reveals: each block's offsets are handed out in a fresh pseudo-random permutation
 * (a keyed 4-round Feistel network; not a cryptographic guarantee), so two IDs of one block do
 * not tell how many IDs were issued between them. An observer of two IDs can infer the
 * millisecond (database clock) at which each one's block was reserved and, when the two blocks
 * were reserved in the same millisecond, roughly how many blocks lie between them; not the
 * number of IDs issued. IDs of a block that a process never hands out (it exited, or the
 * generator object was destroyed) are simply never used: expect gaps.
 *
 * Round trips: at most one per block. When blocks are used up faster than about one per 10 ms
 * the generator reserves several (up to 64) in one round trip; the very first reservation of a
 * name that has no row yet creates it first (one more statement).
 *
 * Thread-safety: next(), stats() and the accessors are safe to call concurrently on one object.
 * The object can be neither copied nor moved.
 */
class id_generator {
 public:
  /// Milliseconds of 2024-01-01T00:00:00Z since the Unix epoch: the origin of the time part.
  static constexpr std::int64_t epoch_ms = 1704067200000;
  /// Bits of the sequence part.
  static constexpr int sequence_bits = 22;
  /// IDs per millisecond before the counter runs ahead of the clock (2^22), and the largest
  /// block_size.
  static constexpr std::int64_t per_ms = std::int64_t{1} << sequence_bits;

  /**
   * @brief A generator of IDs for `name` on `db`; opens no connection (the first next() does).
   * @throws dblock::error errc::invalid_argument for a bad name (empty, over 255 bytes, a NUL
   *         byte or not valid UTF-8) or a block_size outside 1 .. 2^22.
   */
  id_generator(database db, std::string name, id_generator_options options = {});
  /// Stops the background thread (waiting for a reservation in flight to finish). The IDs
  /// reserved but not handed out are never used. Never throws.
  ~id_generator();
  id_generator(const id_generator&) = delete;
  id_generator& operator=(const id_generator&) = delete;

  /**
   * @brief The next ID (positive); waits for a round trip only when no reserved ID is left.
   *
   * An error of a background reservation is thrown by the next next() that has to wait for it
   * (nothing is lost; the call after that tries again). Calling again after any error is safe:
   * a reservation whose reply was lost only leaves a gap, never a duplicate.
   *
   * A reservation is an autocommit write on its own pooled connection. On SQLite, which has one
   * writer per file, take IDs before opening a write transaction on the same file, not inside
   * it: a reservation needed then waits for the caller's own transaction (until the busy
   * timeout, errc::lock_not_available, which a retrying caller turns into a livelock across
   * processes). PostgreSQL and MySQL have no such restriction.
   * Thread-safety: safe to call concurrently.
   * @throws dblock::error the @ref database_errors "database errors" of the reservation (for
   *         instance errc::schema_missing when the schema is not migrated, errc::in_doubt when
   *         the connection broke after the UPDATE was sent); std::system_error when the
   *         background thread cannot be started.
   */
  std::int64_t next();

  /**
   * @brief `count` IDs, as `count` calls of next() would return them (under one lock, so they
   *        are taken from consecutive positions of this object's blocks).
   * Thread-safety: safe to call concurrently.
   * @throws as next(); IDs taken before an error are not returned (never reused either).
   */
  std::vector<std::int64_t> next(std::size_t count);

  /// The start of the millisecond encoded in an ID's high bits: when its block was reserved,
  /// on the database clock (later if the counter was running ahead of the clock). Never throws.
  static std::chrono::system_clock::time_point time_of(std::int64_t id) noexcept;

  /// Counters of this object. Thread-safety: safe to call concurrently. Never throws.
  id_generator_stats stats() const;
  /// The generator name. Never throws.
  const std::string& name() const noexcept;
  /// The options, as checked. Never throws.
  const id_generator_options& options() const noexcept;

 private:
  std::unique_ptr<detail::id_generator_state> s_;
};

}  // namespace dblock
