-- The same index as on MySQL (its wake-up connection reads a handle's queue entries by bell), so
-- that the queue table and the schema version stay the same on every backend; SQLite leaves
-- bell empty.
CREATE INDEX {{prefix}}lw_bell_idx ON {{prefix}}lock_waiter (bell);
