-- Semaphores (include/dblock/semaphore.hpp). A semaphore's permits are leases in resource_lock,
-- one row per permit slot, named "<semaphore name>" U+FFFF "<slot>" (U+FFFF is refused in the
-- names users give, so a permit never shares a row with a lock); this table records how many
-- permits each semaphore was declared with, so that a user declaring another count is refused
-- instead of silently resizing it.
CREATE TABLE {{prefix}}semaphore (
  semaphore_name  VARCHAR(255)   NOT NULL,
  permits         INTEGER        NOT NULL,
  declared_at     TIMESTAMPTZ(6) NOT NULL,
  CONSTRAINT {{prefix}}sem_pkey PRIMARY KEY (semaphore_name),
  CONSTRAINT {{prefix}}sem_permits_pos CHECK (permits > 0)
);
