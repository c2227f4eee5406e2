-- The TTL that a fair waiter would be handed the lease with in the release (PostgreSQL, 0011
-- there): the same column on every backend, so that the queue table stays the same. This backend
-- never hands a lease over in the release and leaves it 0.
ALTER TABLE {{prefix}}lock_waiter ADD COLUMN grant_ttl_us BIGINT NOT NULL DEFAULT 0;
