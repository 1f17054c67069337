-- +goose Up
-- The trace context of the status change a webhook reports, so the delivery
-- (sent later, by any worker) continues the order's trace, and the
-- order's request_id, so every log line about the delivery names it.
ALTER TABLE webhook_deliveries
    ADD COLUMN request_id    text NOT NULL DEFAULT '',
    ADD COLUMN trace_context jsonb NOT NULL DEFAULT '{}';

-- +goose Down
ALTER TABLE webhook_deliveries
    DROP COLUMN trace_context,
    DROP COLUMN request_id;
