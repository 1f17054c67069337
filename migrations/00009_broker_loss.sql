-- +goose Up
-- A broker outage costs time, never orders.
--
-- outbox.order_id names the order an event is about, so that the compensator
-- can tell whether an order's re-drive was acknowledged by the broker (no
-- pending row) and find the order's last published event. stream_seq and
-- stream_created are what the broker's publish ack said: the event's
-- sequence in the stream, and the creation time of the stream that took it.
-- A stream re-created since, or a sequence the stream no longer holds,
-- means the broker lost the event, and the compensator re-drives the order
-- at once.
ALTER TABLE outbox
    ADD COLUMN order_id       uuid,
    ADD COLUMN stream_seq     bigint,
    ADD COLUMN stream_created timestamptz;
UPDATE outbox SET order_id = (headers->>'Orderpipe-Order-Id')::uuid
    WHERE headers ? 'Orderpipe-Order-Id';
CREATE INDEX outbox_order_idx ON outbox (order_id, id);

-- compensator_actions.forced marks what a `compensator --force` run did
-- (the start-up check that the windows fit together was skipped).
ALTER TABLE compensator_actions ADD COLUMN forced boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE compensator_actions DROP COLUMN forced;
DROP INDEX outbox_order_idx;
ALTER TABLE outbox DROP COLUMN stream_created, DROP COLUMN stream_seq, DROP COLUMN order_id;
