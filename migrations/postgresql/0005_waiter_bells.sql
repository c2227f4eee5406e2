-- The wake-up address of a waiter's database handle (its "bell"). A release now notifies the
-- channel of the handle that holds the head of the queue, dblock_w_<bell>, on which that handle
-- listens once for all its waiters, instead of a channel per waiter (which cost a LISTEN and
-- an UNLISTEN per waiting acquire and delayed its first wake-up). Entries without a bell are
-- notified on their owner token's channel as before. MySQL uses the column too (its 0005).
ALTER TABLE {{prefix}}lock_waiter ADD COLUMN bell CHAR(32) NOT NULL DEFAULT '';
CREATE OR REPLACE FUNCTION {{prefix}}dblock_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE head TEXT
; head_bell TEXT
; BEGIN
  SELECT w.owner_token, w.bell INTO head, head_bell FROM {{prefix}}lock_waiter w
   WHERE w.resource_name = NEW.resource_name AND w.owner_token <> NEW.owner_token
     AND w.expires_at > clock_timestamp()
   ORDER BY w.ticket LIMIT 1
  ; IF head IS NOT NULL THEN
      PERFORM pg_notify('dblock_w_' || CASE WHEN head_bell = '' THEN head ELSE head_bell END,
                        NEW.fence::text || ':' || head || ':' || NEW.resource_name)
  ; END IF
  ; RETURN NULL
; END $$;
