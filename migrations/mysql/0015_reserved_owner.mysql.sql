-- MySQL 8's file of this version: MariaDB's (0015_reserved_owner.sql) with one change, in the
-- UTF-8 check of each procedure's name. MySQL 8 converts bytes that are not UTF-8 to NULL, where
-- MariaDB substitutes '?': `CAST(CONVERT(p_name USING utf8mb4) AS BINARY) <> p_name` is then
-- NULL, and the IF would let the name through. The null-safe comparison (<=>) refuses it on
-- both servers.
--
-- The owner of 32 zeros is reserved: it holds the lock row of a name in session mode (the name's
-- marker, docs/session-leases.md). A caller of the SQL procedures who used it could renew or
-- release that marker, and a durable lease of the name could then run beside the session holder.
-- The procedures that take an owner (migration 0012) are made again with one more argument
-- check refusing it, as the library never makes it; they are otherwise unchanged (a routine is
-- replaced whole, never patched).

DROP PROCEDURE IF EXISTS {{prefix}}dblock_acquire;
-- Takes the lease `p_name` for `p_owner` for `p_ttl_ms`; its row: the fence, or NULL when
-- another owner holds it. The same owner again while it holds the lease adds a hold (reentry)
-- and keeps the fence; each hold is released once. A try: it never waits and ignores the fair
-- queue. One statement, as the library's (the fence comes back through LAST_INSERT_ID()).
CREATE PROCEDURE {{prefix}}dblock_acquire(IN p_name VARBINARY(1024), IN p_owner VARCHAR(64),
    IN p_ttl_ms BIGINT)
  SQL SECURITY INVOKER MODIFIES SQL DATA
  BEGIN
    DECLARE v_fence BIGINT;
    -- The arguments, checked as the library does (written out in each routine: a nested CALL
    -- costs about 8 % of the lease cycle at 16 clients): a name of 1..255 bytes of UTF-8
    -- without NUL or U+FFFF (reserved for dblock's internal names), an owner of 1..32
    -- characters from [A-Za-z0-9_.:-] not starting with "forced" (the mark of a forced
    -- release), a TTL of 10 ms .. 1 year, a positive fence.
    IF p_name IS NULL OR LENGTH(p_name) NOT BETWEEN 1 AND 255 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a resource name is 1..255 bytes';
    END IF;
    IF LOCATE(X'EFBFBF', p_name) > 0 OR LOCATE(X'00', p_name) > 0
       OR NOT (CAST(CONVERT(p_name USING utf8mb4) AS BINARY) <=> p_name) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: a resource name is UTF-8 without NUL or U+FFFF (reserved for internal names)';
    END IF;
    IF p_owner IS NULL OR NOT (p_owner REGEXP '^[A-Za-z0-9_.:-]{1,32}$')
       OR LEFT(p_owner, 6) = 'forced' THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: an owner is 1..32 characters of [A-Za-z0-9_.:-], not starting with "forced"';
    END IF;
    IF p_owner = REPEAT('0', 32) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: the owner of 32 zeros is reserved (it marks a name in session mode)';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms NOT BETWEEN 10 AND 31536000000 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a TTL is 10 .. 31536000000 ms';
    END IF;
    SET v_fence = LAST_INSERT_ID(0);
    INSERT INTO {{prefix}}resource_lock (resource_name, owner_token, fence, hold_count,
        acquired_at, expires_at, holder_host, holder_pid, holder_thread)
      VALUES (p_name, p_owner,
        LAST_INSERT_ID(COALESCE((SELECT max_fence FROM {{prefix}}resource_lock_fence_floor
                                  WHERE id = 1), 0) + 1),
        1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL p_ttl_ms * 1000 MICROSECOND,
        CONCAT('sql ', SUBSTRING_INDEX(USER(), '@', -1)), CONNECTION_ID(), 'sql')
      ON DUPLICATE KEY UPDATE
        fence = IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                     OR hold_count = 0,
                   LAST_INSERT_ID(IF(owner_token = VALUES(owner_token)
                                       AND expires_at > UTC_TIMESTAMP(6) AND hold_count > 0,
                                     fence, fence + 1)),
                   fence + LAST_INSERT_ID(0)),
        acquired_at = IF(owner_token = VALUES(owner_token) AND expires_at > UTC_TIMESTAMP(6)
                           AND hold_count > 0, acquired_at,
                         IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                              OR hold_count = 0, UTC_TIMESTAMP(6), acquired_at)),
        holder_host = IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                           OR hold_count = 0, VALUES(holder_host), holder_host),
        holder_pid = IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                          OR hold_count = 0, VALUES(holder_pid), holder_pid),
        holder_thread = IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                             OR hold_count = 0, VALUES(holder_thread), holder_thread),
        owner_token = IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                           OR hold_count = 0, VALUES(owner_token), owner_token),
        hold_count = IF(owner_token = VALUES(owner_token) AND expires_at > UTC_TIMESTAMP(6)
                          AND hold_count > 0, hold_count + 1,
                        IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                             OR hold_count = 0, 1, hold_count)),
        expires_at = IF(owner_token = VALUES(owner_token) OR expires_at <= UTC_TIMESTAMP(6)
                          OR hold_count = 0, VALUES(expires_at), expires_at);
    SET v_fence = LAST_INSERT_ID();
    SELECT IF(v_fence > 0, v_fence, NULL) AS fence;
END;

DROP PROCEDURE IF EXISTS {{prefix}}dblock_renew;
-- Extends the lease to `p_ttl_ms` from now; its row: 1 while `p_owner` holds it at `p_fence`,
-- 0 once it is lost (expired, taken over, released by force).
CREATE PROCEDURE {{prefix}}dblock_renew(IN p_name VARBINARY(1024), IN p_owner VARCHAR(64),
    IN p_fence BIGINT, IN p_ttl_ms BIGINT)
  SQL SECURITY INVOKER MODIFIES SQL DATA
  BEGIN
    IF p_name IS NULL OR LENGTH(p_name) NOT BETWEEN 1 AND 255 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a resource name is 1..255 bytes';
    END IF;
    IF LOCATE(X'EFBFBF', p_name) > 0 OR LOCATE(X'00', p_name) > 0
       OR NOT (CAST(CONVERT(p_name USING utf8mb4) AS BINARY) <=> p_name) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: a resource name is UTF-8 without NUL or U+FFFF (reserved for internal names)';
    END IF;
    IF p_owner IS NULL OR NOT (p_owner REGEXP '^[A-Za-z0-9_.:-]{1,32}$')
       OR LEFT(p_owner, 6) = 'forced' THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: an owner is 1..32 characters of [A-Za-z0-9_.:-], not starting with "forced"';
    END IF;
    IF p_owner = REPEAT('0', 32) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: the owner of 32 zeros is reserved (it marks a name in session mode)';
    END IF;
    IF p_ttl_ms IS NULL OR p_ttl_ms NOT BETWEEN 10 AND 31536000000 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a TTL is 10 .. 31536000000 ms';
    END IF;
    IF p_fence IS NOT NULL AND p_fence < 1 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a fence is positive';
    END IF;
    UPDATE {{prefix}}resource_lock
       SET expires_at = UTC_TIMESTAMP(6) + INTERVAL p_ttl_ms * 1000 MICROSECOND
     WHERE resource_name = p_name AND owner_token = p_owner AND fence = p_fence
       AND hold_count > 0 AND expires_at > UTC_TIMESTAMP(6);
    SELECT ROW_COUNT() > 0 AS renewed;
END;

DROP PROCEDURE IF EXISTS {{prefix}}dblock_release;
-- Releases one hold; its row: 1 when `p_owner` held the lease at `p_fence`, 0 when it was lost
-- already. The last hold frees the lease and, as the library's release does, interrupts the
-- sleeping wake-up connection of the head of its waiter queue (KILL QUERY; one that this user
-- may not interrupt is skipped: that waiter finds the lease free at its next poll).
CREATE PROCEDURE {{prefix}}dblock_release(IN p_name VARBINARY(1024), IN p_owner VARCHAR(64),
    IN p_fence BIGINT)
  SQL SECURITY INVOKER MODIFIES SQL DATA
  BEGIN
    DECLARE v_released BIGINT;
    DECLARE v_sleeper BIGINT;
    IF p_name IS NULL OR LENGTH(p_name) NOT BETWEEN 1 AND 255 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a resource name is 1..255 bytes';
    END IF;
    IF LOCATE(X'EFBFBF', p_name) > 0 OR LOCATE(X'00', p_name) > 0
       OR NOT (CAST(CONVERT(p_name USING utf8mb4) AS BINARY) <=> p_name) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: a resource name is UTF-8 without NUL or U+FFFF (reserved for internal names)';
    END IF;
    IF p_owner IS NULL OR NOT (p_owner REGEXP '^[A-Za-z0-9_.:-]{1,32}$')
       OR LEFT(p_owner, 6) = 'forced' THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: an owner is 1..32 characters of [A-Za-z0-9_.:-], not starting with "forced"';
    END IF;
    IF p_owner = REPEAT('0', 32) THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT =
        'dblock: the owner of 32 zeros is reserved (it marks a name in session mode)';
    END IF;
    IF p_fence IS NOT NULL AND p_fence < 1 THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: a fence is positive';
    END IF;
    SET v_sleeper = LAST_INSERT_ID(0);
    UPDATE {{prefix}}resource_lock
       SET expires_at = CASE WHEN hold_count <= 1 THEN UTC_TIMESTAMP(6) ELSE expires_at END,
           hold_count = hold_count - 1,
           holder_pid = holder_pid + 0 * LAST_INSERT_ID(IF(hold_count = 0, COALESCE(
             (SELECT IF(w.bell = '', NULL, IS_USED_LOCK(CONCAT('dblock-bell-', w.bell)))
                FROM {{prefix}}lock_waiter w
               WHERE w.resource_name = p_name AND w.owner_token <> p_owner
                 AND w.expires_at > UTC_TIMESTAMP(6)
               ORDER BY w.ticket LIMIT 1), 0), 0))
     WHERE resource_name = p_name AND owner_token = p_owner AND fence = p_fence
       AND hold_count > 0 AND expires_at > UTC_TIMESTAMP(6);
    SET v_released = ROW_COUNT();
    SET v_sleeper = LAST_INSERT_ID();
    IF v_released > 0 AND v_sleeper > 0 THEN
      BEGIN
        DECLARE CONTINUE HANDLER FOR SQLEXCEPTION BEGIN END;
        KILL QUERY v_sleeper;
      END;
    END IF;
    SELECT v_released > 0 AS released;
END;
