-- The fence epoch (docs/fast-leases.md). A lock table can be made non-durable (PostgreSQL:
-- UNLOGGED, dblock::set_lease_durability): its writes skip the WAL flush, and a server crash
-- loses its rows. Every connection that acquires leases in such a table first raises epoch by
-- one in a durable transaction, and its fences are at least epoch * 2^32, so every fence issued
-- after a crash is above every fence issued before it, also those the crash lost. It stays 0
-- while the lock table is durable.
ALTER TABLE {{prefix}}resource_lock_fence_floor ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
