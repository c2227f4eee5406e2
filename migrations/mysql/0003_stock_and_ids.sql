-- Segmented stock and ID generators; see the PostgreSQL file. Names are VARBINARY like lock
-- names: they compare byte for byte.
CREATE TABLE {{prefix}}stock_segment (
  stock_name  VARBINARY(255) NOT NULL,
  segment     INT            NOT NULL,
  amount      BIGINT         NOT NULL,
  PRIMARY KEY (stock_name, segment),
  CONSTRAINT {{prefix}}ss_amount_nonneg CHECK (amount >= 0),
  CONSTRAINT {{prefix}}ss_segment_nonneg CHECK (segment >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE {{prefix}}id_block (
  generator  VARBINARY(255) NOT NULL,
  next_id    BIGINT         NOT NULL,
  PRIMARY KEY (generator),
  CONSTRAINT {{prefix}}ib_next_nonneg CHECK (next_id >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
