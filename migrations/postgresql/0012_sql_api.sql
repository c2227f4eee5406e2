-- The lock protocol as SQL functions (docs/sql-api.md): a client in any language takes, renews
-- and releases the same leases as the library and the CLI, and checks a fence inside its own
-- transaction. They run the library's own statements (src/storage/statements.cpp and
-- src/dialect/postgresql/vocabulary.cpp): the same rows, fences, TTLs and database clock, so a
-- lease taken here blocks the library and the reverse, and the reaper, `dblock status`,
-- `release --force` and the waiter queue treat it like any other. SECURITY INVOKER: a caller
-- needs EXECUTE on the functions and the privileges on dblock's tables that they use.
--
-- Errors: SQLSTATE 22023 for a bad argument; DL001 from check_fence() when the fence is not the
-- current, unexpired grant of the name; DL002 when the lock table is in fast lease mode
-- (UNLOGGED, docs/fast-leases.md), whose fence epoch only the library's connections keep.

-- Checks the arguments as the library does: a name of 1..255 bytes without U+FFFF (reserved for
-- dblock's internal names), an owner of 1..32 characters from [A-Za-z0-9_.:-] that does not start
-- with "forced" (the mark of a forced release), a TTL of 10 ms .. 1 year.
CREATE OR REPLACE FUNCTION {{prefix}}dblock_check_args(p_name TEXT, p_owner TEXT, p_ttl_ms BIGINT,
                                                       p_fence BIGINT, p_need_ttl BOOLEAN)
RETURNS VOID LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
  IF p_name IS NULL OR octet_length(p_name) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'dblock: a resource name is 1..255 bytes, not ' ||
                COALESCE(octet_length(p_name)::TEXT, 'NULL');
  END IF;
  IF strpos(p_name, chr(65535)) > 0 THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'dblock: a resource name cannot contain U+FFFF (reserved for internal names)';
  END IF;
  IF p_owner IS NULL OR p_owner !~ '^[A-Za-z0-9_.:-]{1,32}$' OR p_owner LIKE 'forced%' THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'dblock: an owner is 1..32 characters of [A-Za-z0-9_.:-], not starting with "forced"';
  END IF;
  IF p_need_ttl AND (p_ttl_ms IS NULL OR p_ttl_ms NOT BETWEEN 10 AND 31536000000) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'dblock: a TTL is 10 .. 31536000000 ms, not ' || COALESCE(p_ttl_ms::TEXT, 'NULL');
  END IF;
  IF p_fence IS NOT NULL AND p_fence < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'dblock: a fence is positive';
  END IF;
END $$;

-- The lock table in fast lease mode: refused (DL002).
CREATE OR REPLACE FUNCTION {{prefix}}dblock_check_durable()
RETURNS VOID LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
  IF (SELECT relpersistence FROM pg_class
       WHERE oid = '{{prefix}}resource_lock'::regclass) = 'u' THEN
    RAISE EXCEPTION USING ERRCODE = 'DL002',
      MESSAGE = 'dblock: the lock table is in fast lease mode (not durable); the SQL functions '
                'need a durable one (dblock migrate --lease-durability durable)';
  END IF;
END $$;

-- Takes the lease `p_name` for `p_owner` for `p_ttl_ms`: its fence, or NULL when another owner
-- holds it. The same owner again while it holds the lease adds a hold (reentry) and keeps the
-- fence; each hold is released once. A try: it never waits and ignores the fair queue.
CREATE OR REPLACE FUNCTION {{prefix}}dblock_acquire(p_name TEXT, p_owner TEXT, p_ttl_ms BIGINT)
RETURNS BIGINT LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
  v_fence BIGINT;
BEGIN
  PERFORM {{prefix}}dblock_check_args(p_name, p_owner, p_ttl_ms, NULL, TRUE);
  PERFORM {{prefix}}dblock_check_durable();
  INSERT INTO {{prefix}}resource_lock AS l (resource_name, owner_token, fence, hold_count,
                                            acquired_at, expires_at, holder_host, holder_pid,
                                            holder_thread)
  SELECT p_name, p_owner,
         COALESCE((SELECT max_fence FROM {{prefix}}resource_lock_fence_floor WHERE id = 1), 0) + 1,
         1, clock_timestamp(), clock_timestamp() + p_ttl_ms * INTERVAL '1 millisecond',
         'sql ' || COALESCE(host(inet_client_addr()), 'local'), pg_backend_pid(), 'sql'
   WHERE NOT EXISTS (SELECT 1 FROM {{prefix}}resource_lock o
                      WHERE o.resource_name = p_name AND o.owner_token <> p_owner
                        AND o.hold_count > 0 AND o.expires_at > clock_timestamp())
  ON CONFLICT (resource_name) DO UPDATE SET
    fence = CASE WHEN l.owner_token = EXCLUDED.owner_token AND l.expires_at > EXCLUDED.acquired_at
                      AND l.hold_count > 0 THEN l.fence ELSE l.fence + 1 END,
    hold_count = CASE WHEN l.owner_token = EXCLUDED.owner_token
                           AND l.expires_at > EXCLUDED.acquired_at AND l.hold_count > 0
                      THEN l.hold_count + 1 ELSE 1 END,
    acquired_at = CASE WHEN l.owner_token = EXCLUDED.owner_token
                            AND l.expires_at > EXCLUDED.acquired_at AND l.hold_count > 0
                       THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
    owner_token = EXCLUDED.owner_token, expires_at = EXCLUDED.expires_at,
    holder_host = EXCLUDED.holder_host, holder_pid = EXCLUDED.holder_pid,
    holder_thread = EXCLUDED.holder_thread
  WHERE l.owner_token = EXCLUDED.owner_token OR l.expires_at <= EXCLUDED.acquired_at
        OR l.hold_count = 0
  RETURNING fence INTO v_fence;
  RETURN v_fence;
END $$;

-- Extends the lease to `p_ttl_ms` from now: true while `p_owner` holds it at `p_fence`, false
-- once it is lost (expired, taken over, released by force).
CREATE OR REPLACE FUNCTION {{prefix}}dblock_renew(p_name TEXT, p_owner TEXT, p_fence BIGINT,
                                           p_ttl_ms BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
  PERFORM {{prefix}}dblock_check_args(p_name, p_owner, p_ttl_ms, p_fence, TRUE);
  UPDATE {{prefix}}resource_lock
     SET expires_at = clock_timestamp() + p_ttl_ms * INTERVAL '1 millisecond'
   WHERE resource_name = p_name AND owner_token = p_owner AND fence = p_fence
     AND hold_count > 0 AND expires_at > clock_timestamp();
  RETURN FOUND;
END $$;

-- Releases one hold: true when `p_owner` held the lease at `p_fence`, false when it was lost
-- already. The last hold frees the lease and notifies the head of its waiter queue, as the
-- library's release does, so a library waiter takes it at once. `durable` false: a release
-- that frees the lease does not wait for the WAL flush (synchronous_commit off for its
-- transaction, as the library's own release): a server crash can undo that release only, and
-- the lease then runs out at its TTL. Meant for a release that is a transaction of its own
-- (autocommit); ignored when the transaction wrote anything before it, whose commit stays as it
-- is. Writes after it in the same transaction would share its commit: make it the last.
CREATE OR REPLACE FUNCTION {{prefix}}dblock_release(p_name TEXT, p_owner TEXT, p_fence BIGINT,
                                                    durable BOOLEAN DEFAULT TRUE)
RETURNS BOOLEAN LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
  v_holds INTEGER;
  v_wrote BOOLEAN := txid_current_if_assigned() IS NOT NULL;
BEGIN
  PERFORM {{prefix}}dblock_check_args(p_name, p_owner, NULL, p_fence, FALSE);
  UPDATE {{prefix}}resource_lock
     SET expires_at = CASE WHEN hold_count <= 1 THEN clock_timestamp() ELSE expires_at END,
         hold_count = hold_count - 1
   WHERE resource_name = p_name AND owner_token = p_owner AND fence = p_fence
     AND hold_count > 0 AND expires_at > clock_timestamp()
  RETURNING hold_count INTO v_holds;
  IF NOT FOUND THEN
    RETURN FALSE;
  END IF;
  IF v_holds = 0 THEN
    IF durable IS FALSE AND NOT v_wrote THEN
      PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_notify('dblock_w_' || CASE WHEN h.bell = '' THEN h.owner_token
                                          ELSE split_part(h.bell, '.', 1) END,
                      p_fence::TEXT || ':' || h.owner_token ||
                      CASE WHEN strpos(h.bell, '.') > 0 THEN '@' || split_part(h.bell, '.', 2)
                           ELSE '' END || ':' || p_name)
       FROM (SELECT CAST(w.owner_token AS TEXT) AS owner_token, CAST(w.bell AS TEXT) AS bell
               FROM {{prefix}}lock_waiter w
              WHERE w.resource_name = p_name AND w.owner_token <> p_owner
                AND w.expires_at > clock_timestamp()
              ORDER BY w.ticket LIMIT 1) h;
  END IF;
  RETURN TRUE;
END $$;

-- Raises DL001 unless `p_fence` is the current, unexpired grant of `p_name`, and locks the lease
-- row for the rest of the caller's transaction: no other owner can take the lease before that
-- transaction ends, so its COMMIT lands only while the lease is the caller's (the rule of the
-- library's fenced()). Call it first in the transaction whose writes the lease guards.
CREATE OR REPLACE FUNCTION {{prefix}}dblock_check_fence(p_name TEXT, p_fence BIGINT)
RETURNS VOID LANGUAGE plpgsql SECURITY INVOKER AS $$
BEGIN
  IF p_name IS NULL OR p_fence IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'dblock: check_fence of NULL';
  END IF;
  PERFORM 1 FROM {{prefix}}resource_lock
    WHERE resource_name = p_name AND fence = p_fence AND hold_count > 0
      AND expires_at > clock_timestamp()
    FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING ERRCODE = 'DL001',
      MESSAGE = format('dblock: fence %s is not the current grant of lease %L (expired, released '
                       'or taken over)', p_fence, left(p_name, 64));
  END IF;
END $$;
