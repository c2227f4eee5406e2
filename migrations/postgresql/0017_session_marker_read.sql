-- Session leases (docs/session-leases.md): a grant reads the name's marker (its lock row, held for
-- good by the owner of 32 zeros) through this function, which the lock statement calls after it
-- has the lock. A plain subquery would read it in the snapshot the statement started with, before
-- the lock: a session-mode acquire that started before leave_session_mode() gave the name back to
-- row mode could then be granted after it, beside a row-mode holder. In READ COMMITTED each
-- statement of a VOLATILE function takes a new snapshot, so the read sees every change committed
-- before the lock was granted. Under REPEATABLE READ or SERIALIZABLE (a session default the
-- caller chose) the snapshot is the statement's, so the read locks the row (FOR SHARE): a marker
-- changed since that snapshot is then a serialization failure (SQLSTATE 40001), never a stale
-- answer. NULL when the name has no marker.
CREATE OR REPLACE FUNCTION {{prefix}}dblock_session_marker(p_name TEXT, p_marker TEXT)
RETURNS BIGINT LANGUAGE plpgsql VOLATILE SECURITY INVOKER AS $$
DECLARE
  v_fence BIGINT;
BEGIN
  IF current_setting('transaction_isolation') = 'read committed' THEN
    SELECT fence INTO v_fence FROM {{prefix}}resource_lock
     WHERE resource_name = p_name AND owner_token = p_marker AND hold_count > 0;
  ELSE
    SELECT fence INTO v_fence FROM {{prefix}}resource_lock
     WHERE resource_name = p_name AND owner_token = p_marker AND hold_count > 0 FOR SHARE;
  END IF;
  RETURN v_fence;
END $$;
