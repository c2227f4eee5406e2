-- Session leases (docs/session-leases.md): the fences of a lease held as a server session lock come from this
-- sequence, added to the fence of the name's marker row (its lock row, held for good by the
-- session mode). nextval is crash-safe: a value is never handed out twice, also after a crash
-- (the sequence logs ahead and a transaction that logs it flushes at commit).
CREATE SEQUENCE IF NOT EXISTS {{prefix}}session_fence;
