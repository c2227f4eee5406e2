-- Session leases (docs/session-leases.md): the fences of a lease held as a server session lock
-- (GET_LOCK) come from this sequence, added to the fence of the name's marker row (its lock row,
-- held for good by the session mode). The sequence alone is not crash-safe: it stores the end of
-- each block of values it caches, but that write is not flushed with its statement, so a crash
-- can hand out values again. A session fence therefore also adds the fence epoch * 2^32, which
-- each connection raises in a durable transaction before its first grant: every fence after a
-- crash is above every fence before it. INCREMENT BY 0 (steps of auto_increment_increment, 1
-- unless set) is what a Galera cluster accepts for a cached sequence; session leases are refused
-- there, but the schema is the same on every server.
CREATE SEQUENCE IF NOT EXISTS {{prefix}}session_fence INCREMENT BY 0;
