-- MySQL 8.4 makes users with caching_sha2_password, which Debian's MariaDB client library (behind
-- SOCI's MySQL backend, and so behind dblock) speaks only over TLS. The test user signs in with
-- mysql_native_password instead (the server runs with --mysql-native-password=ON). Run by the
-- image once, after it has made the database and the user.
ALTER USER 'dblock'@'%' IDENTIFIED WITH mysql_native_password BY 'dblock-secret';
-- What the suite's privilege-free paths read: the process list of other sessions of this user is
-- visible to it without PROCESS; dblock needs nothing more (docs/getting-started.md, Privileges).
