-- Session leases (docs/session-leases.md): the fences of a lease held as a server session lock
-- (GET_LOCK) come from this sequence, added to the fence of the name's marker row (its lock row,
-- held for good by the session mode). A value is never handed out twice, also after a crash: the
-- sequence stores the end of each block of values it caches before it hands out the block's
-- first one, and a restart goes on from there (the cached values left unused are skipped).
CREATE SEQUENCE IF NOT EXISTS {{prefix}}session_fence;
