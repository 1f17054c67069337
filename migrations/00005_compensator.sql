-- +goose Up
-- The compensator's bookkeeping on the order row, so that its write-back is
-- one compare-and-set on the same row as the status:
--   UPDATE orders ... WHERE order_id = $1 AND status = $seen
--                        AND redrive_attempts = $seenAttempt
-- redrive_status is the status that redrive_attempts counts for: when the
-- order moves on, the count starts again (progress shows the pipeline is
-- alive). redriven_at restarts the stuck deadline after a re-drive.
ALTER TABLE orders
    ADD COLUMN redrive_attempts int NOT NULL DEFAULT 0 CHECK (redrive_attempts >= 0),
    ADD COLUMN redrive_status   text CHECK (redrive_status IN ('processing', 'reserved', 'paid')),
    ADD COLUMN redriven_at      timestamptz;

-- The compensator's scan walks open orders in order_id (UUIDv7) order.
CREATE INDEX orders_open_id_idx ON orders (order_id) WHERE status IN ('processing', 'reserved', 'paid');

-- The refund sweep: payments that may hold money of a cancelled order are
-- pending ones (a charge of unknown outcome), succeeded ones with a refund
-- due (refund_key set by the unwind), and those of recently cancelled orders.
CREATE INDEX payments_unsettled_idx ON payments (order_id)
    WHERE status = 'pending' OR (status = 'succeeded' AND refund_key IS NOT NULL);
CREATE INDEX orders_cancelled_idx ON orders (updated_at) WHERE status = 'cancelled';

-- compensator_actions: what a compensator did, to which order, when, why and
-- which process did it (actor = host/pid/instance). A dry run never writes
-- here. 'refund' records the provider's refund of an unwound order's charge.
CREATE TABLE compensator_actions (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    order_id    uuid NOT NULL REFERENCES orders (order_id),
    action      text NOT NULL CHECK (action IN ('redrive', 'unwind', 'refund', 'skip')),
    from_status text NOT NULL,
    attempt     int NOT NULL CHECK (attempt >= 0),
    reason      text NOT NULL,
    actor       text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX compensator_actions_order_idx ON compensator_actions (order_id, id);
CREATE INDEX compensator_actions_created_idx ON compensator_actions (created_at);

-- +goose Down
DROP TABLE compensator_actions;
DROP INDEX orders_cancelled_idx;
DROP INDEX payments_unsettled_idx;
DROP INDEX orders_open_id_idx;
ALTER TABLE orders
    DROP COLUMN redriven_at,
    DROP COLUMN redrive_status,
    DROP COLUMN redrive_attempts;
