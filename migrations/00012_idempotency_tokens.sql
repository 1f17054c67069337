-- +goose Up
-- Server-issued idempotency tokens (POST /v1/idempotency-tokens), for
-- clients that cannot keep a request_id of their own. A token is the
-- request_id of the order it is used for, so the order's unique
-- (client_id, request_id) stays the one guard against a second order; the
-- token's state only gates concurrent use: unused → processing (a request
-- holds it until claimed_until) → used. A processing token whose holder
-- died (claimed_until passed) may be claimed again.
CREATE TABLE idempotency_tokens (
    token         text PRIMARY KEY CHECK (token ~ '^opt1\.[0-9a-f]{48}$'),
    client_id     uuid NOT NULL REFERENCES api_clients (client_id) ON DELETE CASCADE,
    state         text NOT NULL DEFAULT 'unused' CHECK (state IN ('unused', 'processing', 'used')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL,
    claimed_until timestamptz,
    used_at       timestamptz,
    -- A used token lives as long as its order.
    order_id      uuid REFERENCES orders (order_id) ON DELETE CASCADE,
    CHECK ((state = 'processing') = (claimed_until IS NOT NULL)),
    CHECK ((state = 'used') = (order_id IS NOT NULL))
);
-- The sweep of expired unused tokens.
CREATE INDEX idempotency_tokens_unused_expiry ON idempotency_tokens (expires_at) WHERE state = 'unused';

-- +goose Down
DROP TABLE idempotency_tokens;
