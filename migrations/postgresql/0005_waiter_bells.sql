-- The wake-up address of a waiter's database handle, for backends whose release rings a
-- connection rather than a channel (MySQL, see its 0005 file). PostgreSQL rings through
-- NOTIFY (0004) and leaves it empty; the column keeps the queue table the same everywhere.
ALTER TABLE {{prefix}}lock_waiter ADD COLUMN bell CHAR(32) NOT NULL DEFAULT '';
