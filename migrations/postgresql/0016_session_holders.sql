-- Session leases (docs/session-leases.md): a grant writes no row. A hold that lasts reports itself
-- here in its first renewal (a third of its TTL after the grant), so that `dblock status` can show
-- its fence, its age and its client; its release deletes the report. A report counts only while
-- its server session holds the name's lock (status reads the server's lock table), and each
-- connection deletes the reports of its server session id before its first grant, so a report
-- left by a session that ended never passes for a later session's with the same id.
CREATE TABLE IF NOT EXISTS {{prefix}}session_holder (
  server_session BIGINT       NOT NULL,
  resource_name  VARCHAR(255) NOT NULL,
  fence          BIGINT       NOT NULL,
  acquired_us    BIGINT       NOT NULL,
  holder_host    VARCHAR(255) NOT NULL,
  holder_pid     BIGINT       NOT NULL,
  holder_thread  VARCHAR(64)  NOT NULL,
  CONSTRAINT {{prefix}}sh_pkey PRIMARY KEY (server_session, resource_name)
);
