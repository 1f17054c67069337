-- +goose Up
-- The relay no longer holds row locks (and a pooled connection) across its
-- publishes: it claims pending rows with a short lease in one statement,
-- publishes them with no transaction open, then stamps them. A relay that
-- dies mid-batch leaves its claims to expire; another publishes the rows
-- (the broker's duplicate window and the consumers' dedupe rows absorb a
-- second publish).
ALTER TABLE outbox ADD COLUMN claimed_until timestamptz;

-- +goose Down
ALTER TABLE outbox DROP COLUMN claimed_until;
