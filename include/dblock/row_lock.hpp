// dblock: distributed locks and safe concurrent updates on the database you already run.
// Deprecated name of dblock/transaction.hpp, kept for one release.
#pragma once

#include "dblock/transaction.hpp"
