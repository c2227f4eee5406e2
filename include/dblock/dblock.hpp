// dblock: distributed locks and safe concurrent updates on the database you already run.
// Umbrella header: includes every public header.
#pragma once

#include "dblock/admin.hpp"
#include "dblock/cancellation.hpp"
#include "dblock/database.hpp"
#include "dblock/error.hpp"
#include "dblock/lease_lock.hpp"
#include "dblock/listener.hpp"
#include "dblock/migrate.hpp"
#include "dblock/optimistic.hpp"
#include "dblock/reaper.hpp"
#include "dblock/retry.hpp"
#include "dblock/transaction.hpp"
#include "dblock/value.hpp"
