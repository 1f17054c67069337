-- +goose Up
-- webhook_deliveries: one row per status change to deliver to an order's
-- callback_url. webhook_id is derived from (order_id, seq), so the same
-- status change keeps the same id across retries, redeliveries of its event
-- and manual resends, and a second insert of it is a no-op. The payload is
-- stored once and signed afresh (with the attempt's timestamp) on each send.
CREATE TABLE webhook_deliveries (
    webhook_id       text PRIMARY KEY,
    order_id         uuid NOT NULL REFERENCES orders (order_id),
    seq              int NOT NULL CHECK (seq > 0),
    client_id        uuid NOT NULL REFERENCES api_clients (client_id),
    url              text NOT NULL,
    payload          jsonb NOT NULL,
    status           text NOT NULL DEFAULT 'pending',
    attempts         int NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    last_status_code int,
    last_error       text,
    last_latency_ms  int,
    created_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    CONSTRAINT ck_webhook_status CHECK (status IN ('pending', 'delivered', 'failed')),
    CONSTRAINT uk_webhook_order_seq UNIQUE (order_id, seq)
);
-- The delivery worker's claim: due pending rows, oldest first.
CREATE INDEX webhook_deliveries_due_idx ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';

-- webhook_attempts: every send, for operators (`orderpipe webhooks list`).
-- attempt counts from 1 again after a manual resend.
CREATE TABLE webhook_attempts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    webhook_id   text NOT NULL REFERENCES webhook_deliveries (webhook_id) ON DELETE CASCADE,
    attempt      int NOT NULL CHECK (attempt > 0),
    attempted_at timestamptz NOT NULL DEFAULT now(),
    status_code  int,
    latency_ms   int NOT NULL,
    error        text
);
CREATE INDEX webhook_attempts_webhook_idx ON webhook_attempts (webhook_id, id);

-- Live event streams (GET /v1/orders/{id}/events) in any replica learn of a
-- new history row through NOTIFY; the notification is sent at commit, so a
-- listener never sees a change that is not committed.
-- +goose StatementBegin
CREATE FUNCTION notify_order_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('order_events', NEW.order_id::text);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
CREATE TRIGGER order_events_notify AFTER INSERT ON order_events
    FOR EACH ROW EXECUTE FUNCTION notify_order_event();

-- +goose Down
DROP TRIGGER order_events_notify ON order_events;
DROP FUNCTION notify_order_event();
DROP TABLE webhook_attempts;
DROP TABLE webhook_deliveries;
