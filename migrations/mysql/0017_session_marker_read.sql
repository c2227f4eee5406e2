-- Session leases: a grant reads the name's marker through this function, which the lock statement
-- calls after GET_LOCK has returned; see the PostgreSQL file. A subquery in the same statement is
-- read before GET_LOCK returns; the function's read comes after it, and InnoDB takes the read's
-- snapshot at that read (REPEATABLE READ and READ COMMITTED alike), so it sees every change
-- committed before the lock was granted. NULL when the name has no marker. READS SQL DATA: no
-- SUPER or log_bin_trust_function_creators needed where the binary log is on.
DROP FUNCTION IF EXISTS {{prefix}}dblock_session_marker;
CREATE FUNCTION {{prefix}}dblock_session_marker(p_name VARBINARY(255), p_marker CHAR(32))
  RETURNS BIGINT NOT DETERMINISTIC READS SQL DATA SQL SECURITY INVOKER
  RETURN (SELECT fence FROM {{prefix}}resource_lock
    WHERE resource_name = p_name AND owner_token = p_marker AND hold_count > 0);
