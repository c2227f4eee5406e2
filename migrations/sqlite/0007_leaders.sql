-- Leader elections (include/dblock/election.hpp). The leadership itself is a lease in
-- resource_lock, on the internal name "<election name>" U+FFFF "L"; this table holds the
-- identity the winner announced, written in a fenced transaction right after it won (so a row
-- whose fence is not the lease's current fence is a past leader's, never shown as current).
CREATE TABLE {{prefix}}leader (
  election_name  TEXT    NOT NULL PRIMARY KEY
                 CHECK (length(CAST(election_name AS BLOB)) BETWEEN 1 AND 255),
  identity       TEXT    NOT NULL CHECK (length(CAST(identity AS BLOB)) <= 1024),
  fence          INTEGER NOT NULL,
  announced_at   INTEGER NOT NULL
);
