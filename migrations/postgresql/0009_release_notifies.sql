-- The release statement itself notifies the head of the freed lease's queue (a RETURNING
-- clause, see docs/waiting.md), in its own transaction as before, so the lock table needs no
-- trigger: the trigger of 0004/0005 cost every release a PL/pgSQL call, also with nobody
-- waiting. A forced release notifies the same way.
DROP TRIGGER IF EXISTS {{prefix}}rl_wake ON {{prefix}}resource_lock;
DROP FUNCTION IF EXISTS {{prefix}}dblock_wake();
-- The same index as on MySQL (its wake-up connection reads a handle's queue entries by bell), so
-- that the queue table stays the same on every backend.
CREATE INDEX {{prefix}}lw_bell_idx ON {{prefix}}lock_waiter (bell);
