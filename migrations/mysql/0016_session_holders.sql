-- Session leases: what `dblock status` shows of a hold that lasts (its fence, its age, its client);
-- see the PostgreSQL file. server_session is the holder's CONNECTION_ID().
CREATE TABLE IF NOT EXISTS {{prefix}}session_holder (
  server_session BIGINT         NOT NULL,
  resource_name  VARBINARY(255) NOT NULL,
  fence          BIGINT         NOT NULL,
  acquired_us    BIGINT         NOT NULL,
  holder_host    VARCHAR(255)   NOT NULL,
  holder_pid     BIGINT         NOT NULL,
  holder_thread  VARCHAR(64)    NOT NULL,
  PRIMARY KEY (server_session, resource_name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
