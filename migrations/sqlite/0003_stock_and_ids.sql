-- Segmented stock and ID generators; see the PostgreSQL file.
CREATE TABLE {{prefix}}stock_segment (
  stock_name  TEXT    NOT NULL CHECK (length(CAST(stock_name AS BLOB)) BETWEEN 1 AND 255),
  segment     INTEGER NOT NULL CHECK (segment >= 0),
  amount      INTEGER NOT NULL CHECK (amount >= 0),
  PRIMARY KEY (stock_name, segment)
);
CREATE TABLE {{prefix}}id_block (
  generator  TEXT    NOT NULL PRIMARY KEY
             CHECK (length(CAST(generator AS BLOB)) BETWEEN 1 AND 255),
  next_id    INTEGER NOT NULL CHECK (next_id >= 0)
);
