-- The wake-up connection of a handle reads the queue entries that carry its bell each time its
-- sleep is interrupted by a release (0005, docs/waiting.md): an index instead of a scan of the
-- whole queue.
CREATE INDEX {{prefix}}lw_bell_idx ON {{prefix}}lock_waiter (bell);
