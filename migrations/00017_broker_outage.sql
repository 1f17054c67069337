-- +goose Up
-- broker_outage: when a compensator pass last found the broker unavailable
-- (unavailable_at), and when a pass first reached it again after that
-- (back_at). An open order's stuck deadline counts from back_at too: the
-- consumers could not act on its last event while the broker was away, so
-- an outage costs time, never orders (a re-drive acknowledged just before
-- the outage gets its whole deadline once the broker is back). One row.
CREATE TABLE broker_outage (
    one            boolean PRIMARY KEY DEFAULT true CHECK (one),
    unavailable_at timestamptz NOT NULL,
    back_at        timestamptz
);

-- +goose Down
DROP TABLE broker_outage;
