-- Semaphores; see the PostgreSQL file. Names are VARBINARY like lock names: they compare byte
-- for byte.
CREATE TABLE {{prefix}}semaphore (
  semaphore_name  VARBINARY(255) NOT NULL,
  permits         INT            NOT NULL,
  declared_at     DATETIME(6)    NOT NULL,
  PRIMARY KEY (semaphore_name),
  CONSTRAINT {{prefix}}sem_permits_pos CHECK (permits > 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
