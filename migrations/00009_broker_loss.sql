-- +goose Up
-- A broker outage costs time, never orders.
--
-- outbox.order_id names the order an event is about, so that the compensator
-- can tell whether an order's re-drive was acknowledged by the broker (no
-- pending row) and find the order's last published event. stream_seq is
-- what the broker's publish ack said: the event's sequence in the stream.
-- A stream created after the event was published, or a sequence the stream
-- no longer holds, means the broker lost the event, and the compensator
-- publishes it again at once (action 'heal').
ALTER TABLE outbox
    ADD COLUMN order_id   uuid,
    ADD COLUMN stream_seq bigint;
UPDATE outbox SET order_id = (headers->>'Orderpipe-Order-Id')::uuid
    WHERE headers ? 'Orderpipe-Order-Id';
CREATE INDEX outbox_order_idx ON outbox (order_id, id);

-- compensator_actions.forced marks what a `compensator --force` run did
-- (the start-up check that the windows fit together was skipped).
ALTER TABLE compensator_actions ADD COLUMN forced boolean NOT NULL DEFAULT false;
ALTER TABLE compensator_actions DROP CONSTRAINT compensator_actions_action_check;
ALTER TABLE compensator_actions ADD CONSTRAINT compensator_actions_action_check
    CHECK (action IN ('redrive', 'unwind', 'refund', 'skip', 'renotify', 'heal'));

-- +goose Down
DELETE FROM compensator_actions WHERE action = 'heal';
ALTER TABLE compensator_actions DROP CONSTRAINT compensator_actions_action_check;
ALTER TABLE compensator_actions ADD CONSTRAINT compensator_actions_action_check
    CHECK (action IN ('redrive', 'unwind', 'refund', 'skip', 'renotify'));
ALTER TABLE compensator_actions DROP COLUMN forced;
DROP INDEX outbox_order_idx;
ALTER TABLE outbox DROP COLUMN stream_seq, DROP COLUMN order_id;
