-- Every lease write (acquire, renew, release) sets expires_at. While expires_at was indexed,
-- PostgreSQL could not make those writes HOT updates: each one added an entry to both of the
-- lock table's indexes, and a name written thousands of times a second left index entries of
-- dead row versions behind faster than they were cleaned (hot-key throughput fell as the server
-- aged, and a renewal cost half as much again). Without the index, a lease write is a HOT
-- update in the row's own page. The reaper walks the table in primary-key order instead
-- (vocabulary::reap_in_key_order(); README, "The reaper").
DROP INDEX IF EXISTS {{prefix}}rl_expires_idx;
