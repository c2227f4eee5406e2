-- The owner of 32 zeros is reserved: it holds the lock row of a name in session mode (the name's
-- marker, docs/session-leases.md). A caller of the SQL functions who used it could renew or
-- release that marker, and a durable lease of the name could then run beside the session holder.
-- The argument check (migration 0012) now refuses it, as the library never makes it.
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
  IF p_owner = repeat('0', 32) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'dblock: the owner of 32 zeros is reserved (it marks a name in session mode)';
  END IF;
  IF p_need_ttl AND (p_ttl_ms IS NULL OR p_ttl_ms NOT BETWEEN 10 AND 31536000000) THEN
    RAISE EXCEPTION USING ERRCODE = '22023',
      MESSAGE = 'dblock: a TTL is 10 .. 31536000000 ms, not ' || COALESCE(p_ttl_ms::TEXT, 'NULL');
  END IF;
  IF p_fence IS NOT NULL AND p_fence < 1 THEN
    RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'dblock: a fence is positive';
  END IF;
END $$;
