-- Semaphores; see the PostgreSQL file.
CREATE TABLE {{prefix}}semaphore (
  semaphore_name  TEXT    NOT NULL PRIMARY KEY
                  CHECK (length(CAST(semaphore_name AS BLOB)) BETWEEN 1 AND 255),
  permits         INTEGER NOT NULL CHECK (permits > 0),
  declared_at     INTEGER NOT NULL
);
