-- Segmented stock (dblock::segmented_stock): a named total split into segment rows, so that
-- concurrent takes update different rows. The total is the sum of a stock's rows.
CREATE TABLE {{prefix}}stock_segment (
  stock_name  VARCHAR(255) NOT NULL,
  segment     INTEGER      NOT NULL,
  amount      BIGINT       NOT NULL,
  CONSTRAINT {{prefix}}ss_pkey PRIMARY KEY (stock_name, segment),
  CONSTRAINT {{prefix}}ss_amount_nonneg CHECK (amount >= 0),
  CONSTRAINT {{prefix}}ss_segment_nonneg CHECK (segment >= 0)
);
-- ID generators (dblock::id_generator): the first ID not yet reserved by any process. It only
-- grows; see include/dblock/id_generator.hpp for the layout of the IDs.
CREATE TABLE {{prefix}}id_block (
  generator  VARCHAR(255) NOT NULL,
  next_id    BIGINT       NOT NULL,
  CONSTRAINT {{prefix}}ib_pkey PRIMARY KEY (generator),
  CONSTRAINT {{prefix}}ib_next_nonneg CHECK (next_id >= 0)
);
