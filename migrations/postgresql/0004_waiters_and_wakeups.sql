-- Waiting (see docs/waiting.md). lock_waiter is the queue of waiters: one row per waiting
-- acquire, itself a lease (a waiter that dies is skipped once expires_at passes, and the reaper
-- deletes it). The ticket, assigned by the database, orders the queue.
CREATE TABLE {{prefix}}lock_waiter (
  ticket         BIGINT GENERATED ALWAYS AS IDENTITY,
  resource_name  VARCHAR(255)   NOT NULL,
  owner_token    CHAR(32)       NOT NULL,
  enqueued_at    TIMESTAMPTZ(6) NOT NULL,
  expires_at     TIMESTAMPTZ(6) NOT NULL,
  holder_host    VARCHAR(255)   NOT NULL,
  holder_pid     BIGINT         NOT NULL,
  CONSTRAINT {{prefix}}lw_pkey PRIMARY KEY (ticket)
);
CREATE INDEX {{prefix}}lw_name_idx ON {{prefix}}lock_waiter (resource_name, ticket);
CREATE INDEX {{prefix}}lw_expires_idx ON {{prefix}}lock_waiter (expires_at);
-- Wake-ups: when a lease is freed (its last hold released, or force-released), the same
-- transaction notifies the head of the live queue, and only it: NOTIFY on channel
-- dblock_w_<its owner token> with the payload "<fence>:<that token>:<resource name>". Each
-- database handle listens on the channels of its own waiters, so one release wakes one waiter
-- and no other listener; a release without waiters sends nothing. A lost notification costs
-- latency only (waiters still poll, bounded by the holder's expiry and poll_max).
CREATE FUNCTION {{prefix}}dblock_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE head TEXT
; BEGIN
  SELECT w.owner_token INTO head FROM {{prefix}}lock_waiter w
   WHERE w.resource_name = NEW.resource_name AND w.owner_token <> NEW.owner_token
     AND w.expires_at > clock_timestamp()
   ORDER BY w.ticket LIMIT 1
  ; IF head IS NOT NULL THEN
      PERFORM pg_notify('dblock_w_' || head,
                        NEW.fence::text || ':' || head || ':' || NEW.resource_name)
  ; END IF
  ; RETURN NULL
; END $$;
CREATE TRIGGER {{prefix}}rl_wake AFTER UPDATE OF hold_count ON {{prefix}}resource_lock
  FOR EACH ROW WHEN (NEW.hold_count = 0 AND OLD.hold_count > 0)
  EXECUTE FUNCTION {{prefix}}dblock_wake();
