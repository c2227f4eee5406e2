// dblock: distributed locks and safe concurrent updates on the database you already run.
// Umbrella header: includes every public header.
#pragma once

/// @file
/// @brief Umbrella header: includes every public header of dblock (not prometheus.hpp, which
/// needs the optional dblock::prometheus target).

/**
 * @page api_overview The C++ API at a glance
 *
 * Distributed locks and safe concurrent updates on the database you already run (PostgreSQL,
 * MySQL/MariaDB or SQLite). Include `<dblock/dblock.hpp>` and link `dblock::dblock`.
 *
 * - dblock::database: a handle on one database (URL, table prefix, connection pool).
 * - dblock::lease_lock and dblock::lease_guard: named leases with fencing tokens, reentrancy,
 *   an optional watchdog and fenced writes.
 * - dblock::transaction, dblock::run_transaction(): row locks (`SELECT … FOR UPDATE`, NOWAIT,
 *   SKIP LOCKED) and whole transactions retried on deadlock.
 * - dblock::versioned_update(), dblock::compare_and_set(): optimistic updates and conditional
 *   updates, retried under a dblock::retry_policy.
 * - dblock::migrate(), dblock::reap_once(), dblock::reaper, dblock::list_locks(),
 *   dblock::force_release(): schema, clean-up and administration.
 * - dblock::listener, dblock::prometheus_listener: events for logs and metrics.
 *
 * Errors: every function reports failures with one exception type, dblock::error, whose
 * dblock::errc code says how to react; each entry lists the codes it throws under "Exceptions",
 * and dblock::errc lists the @ref database_errors "database errors" that any call talking to the
 * database may throw as well. Besides those, std::bad_alloc can come from anywhere, and the
 * exceptions of callbacks you pass in propagate unchanged unless an entry says otherwise.
 *
 * Thread-safety: each class states its own. Free functions that take a database are safe to call
 * concurrently: each call borrows its own pooled connection. Plain option and result structs are
 * values: concurrent reads are safe, a write needs the caller's synchronisation.
 */

/// @namespace dblock
/// @brief Everything public of dblock (dblock::detail is internal and not documented).

#include "dblock/admin.hpp"
#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/deadline.hpp"
#include "dblock/election.hpp"
#include "dblock/error.hpp"
#include "dblock/id_generator.hpp"
#include "dblock/lease_lock.hpp"
#include "dblock/listener.hpp"
#include "dblock/lock_set.hpp"
#include "dblock/lockable.hpp"
#include "dblock/migrate.hpp"
#include "dblock/optimistic.hpp"
#include "dblock/reaper.hpp"
#include "dblock/retry.hpp"
#include "dblock/runs.hpp"
#include "dblock/rwlock.hpp"
#include "dblock/segmented_stock.hpp"
#include "dblock/semaphore.hpp"
#include "dblock/sql_api.hpp"
#include "dblock/transaction.hpp"
#include "dblock/value.hpp"
#include "dblock/version.hpp"
