-- The lock names in byte order, as MySQL (VARBINARY) and SQLite (BINARY) compare them. Under the
-- database's collation (en_US.UTF-8, an ICU locale) a range of names such as a semaphore's
-- permits (`NAME` U+FFFF and the slot's digits) is not contiguous: ICU sorts U+FFFF last and
-- punctuation before digits. The held permits of a semaphore, and the readers a writer waits
-- for, are read as one range of names `COLLATE "C"` (vocabulary::bytewise()); this index makes
-- that range read an index scan instead of a scan of the table. The column keeps its type and
-- collation, so statements that running processes have prepared stay valid while this runs;
-- lease writes stay HOT updates (the name never changes).
CREATE INDEX IF NOT EXISTS {{prefix}}rl_name_bytes_idx ON {{prefix}}resource_lock
  (resource_name COLLATE "C");
