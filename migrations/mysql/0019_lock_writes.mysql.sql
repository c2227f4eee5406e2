-- MySQL 8's file of this version: MariaDB's (0019_lock_writes.sql) with dblock_check_fence's
-- message kept within MySQL 8's 128 characters of MESSAGE_TEXT (a longer one raises error 1648
-- in strict mode instead of DL001; MariaDB allows 512), and a name that is not UTF-8 shown in hex
-- (MySQL 8 converts it to NULL, which would make the message NULL: error 1231).
--
-- On Galera, the fence check and the row lock write the lock row instead of only locking it
-- (src/dialect/mysql/vocabulary.cpp, lock_by_writing). Galera certifies the rows a transaction
-- wrote, not the rows it locked: with SELECT ... FOR UPDATE alone, a fenced transaction on one
-- node whose COMMIT was certified before that node had applied another node's takeover of the
-- lease committed (seen on the test cluster: 5 of 300 tries), and row locks of one name taken on
-- two nodes did not exclude each other at all. Every such lock adds one to `touches`, so the row
-- is in the transaction's write set and certification rolls the later one back (error 1213).
-- dblock_check_fence below writes on every server (a routine cannot ask for Galera portably);
-- on a single server the write locks the row as FOR UPDATE did, at about 90 us more.
ALTER TABLE {{prefix}}resource_lock ADD COLUMN touches BIGINT NOT NULL DEFAULT 0;

DROP PROCEDURE IF EXISTS {{prefix}}dblock_check_fence;
-- Raises DL001 unless `p_fence` is the current, unexpired grant of `p_name`, and locks the lease
-- row for the rest of the caller's transaction: no other owner can take the lease before that
-- transaction ends, so its COMMIT lands only while the lease is the caller's (the rule of the
-- library's fenced()); on Galera, a takeover on another node rolls that COMMIT back (1213).
-- Call it first in the transaction whose writes the lease guards (with autocommit off: under
-- autocommit the lock ends with the CALL). It returns no row, so that a client that reads no
-- result set (SOCI) can run it in its transaction.
CREATE PROCEDURE {{prefix}}dblock_check_fence(IN p_name VARBINARY(1024), IN p_fence BIGINT)
  SQL SECURITY INVOKER MODIFIES SQL DATA
  BEGIN
    DECLARE v_message VARCHAR(255);
    IF p_name IS NULL OR p_fence IS NULL THEN
      SIGNAL SQLSTATE '22023' SET MESSAGE_TEXT = 'dblock: check_fence of NULL';
    END IF;
    UPDATE {{prefix}}resource_lock SET touches = touches + 1
     WHERE resource_name = p_name AND fence = p_fence AND hold_count > 0
       AND expires_at > UTC_TIMESTAMP(6);
    IF ROW_COUNT() = 0 THEN
      SET v_message = LEFT(CONCAT('dblock: fence ', p_fence,
                                  ' is not the current grant of lease ''',
                                  LEFT(COALESCE(CONVERT(p_name USING utf8mb4), HEX(p_name)), 64),
                                  ''' (expired, released or taken over)'), 128);
      SIGNAL SQLSTATE 'DL001' SET MESSAGE_TEXT = v_message;
    END IF;
END;
