-- Leader elections (include/dblock/election.hpp). The leadership itself is a lease in
-- resource_lock, on the internal name "<election name>" U+FFFF "L"; this table holds the
-- identity the winner announced, written in a fenced transaction right after it won (so a row
-- whose fence is not the lease's current fence is a past leader's, never shown as current).
CREATE TABLE {{prefix}}leader (
  election_name  VARCHAR(255)   NOT NULL,
  identity       VARCHAR(1024)  NOT NULL,
  fence          BIGINT         NOT NULL,
  announced_at   TIMESTAMPTZ(6) NOT NULL,
  CONSTRAINT {{prefix}}leader_pkey PRIMARY KEY (election_name)
);
