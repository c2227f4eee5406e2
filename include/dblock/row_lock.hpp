// dblock: distributed locks and safe concurrent updates on the database you already run.
// Deprecated name of dblock/transaction.hpp, kept for one release.
#pragma once

/// @file
/// @deprecated Include dblock/transaction.hpp; this header only includes it and goes away in
/// the next release.

#include "dblock/transaction.hpp"
