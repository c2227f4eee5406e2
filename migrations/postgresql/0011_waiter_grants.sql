-- Grants in the release (docs/waiting.md, "Handed over in the release"). A fair waiter's queue
-- entry carries the TTL of the lease it waits for; a release that frees the lease while such an
-- entry heads the live queue, and the entry waits through the releasing process's own host relay,
-- hands the lease to it in the same statement: owner token, fence + 1 and that TTL, the entry
-- deleted. 0: the waiter is never handed the lease (not fair, or an older client); it takes the
-- lease with its own acquire, as before.
ALTER TABLE {{prefix}}lock_waiter ADD COLUMN grant_ttl_us BIGINT NOT NULL DEFAULT 0;
