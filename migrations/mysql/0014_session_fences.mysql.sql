-- MySQL 8's file of this version (the MariaDB file, 0014_session_fences.sql, creates a SEQUENCE for
-- the fences of session leases). MySQL 8 has no SEQUENCE, and session leases are refused there
-- (docs/mysql.md): nothing to create. The version is recorded all the same, so that both flavors
-- count the same versions.
SELECT 1;
