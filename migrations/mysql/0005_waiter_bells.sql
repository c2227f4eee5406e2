-- Wake-ups across processes on MySQL/MariaDB (see docs/waiting.md). MySQL has no NOTIFY: each
-- database handle with waiters keeps one connection outside its pool asleep in
-- "SELECT SLEEP(n) /* dblock-bell <bell> */", and its waiters' queue entries carry that <bell>.
-- The release statement returns the ticket of the head of the live queue (through
-- LAST_INSERT_ID, in the same round trip); when there is one, the releasing process finds the
-- sleep that carries the head's bell and interrupts it (KILL QUERY), and that handle wakes its
-- waiter. (Not a trigger: any trigger on the lock table makes MariaDB drop the fence that the
-- acquire returns through LAST_INSERT_ID.)
ALTER TABLE {{prefix}}lock_waiter
  ADD COLUMN bell CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '';
