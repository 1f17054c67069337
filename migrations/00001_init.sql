-- +goose Up
-- api_clients: one row per tenant. The API key is random (256 bits) and only
-- its SHA-256 is kept; the webhook secret is needed to sign, so it is kept.
CREATE TABLE api_clients (
    client_id      uuid PRIMARY KEY,
    name           text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    api_key_hash   bytea NOT NULL,
    webhook_secret text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uk_api_key_hash UNIQUE (api_key_hash)
);

-- orders: the record. Everything else (events, messages) can be re-derived
-- from a row here.
CREATE TABLE orders (
    order_id     uuid PRIMARY KEY,
    order_no     text NOT NULL,
    client_id    uuid NOT NULL REFERENCES api_clients (client_id),
    request_id   text NOT NULL CHECK (request_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    fingerprint  bytea NOT NULL,
    status       text NOT NULL,
    user_id      bigint NOT NULL,
    items        jsonb NOT NULL,
    amount       numeric(20, 2) NOT NULL CHECK (amount > 0),
    currency     text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    callback_url text,
    reason       text,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT uk_order_request UNIQUE (client_id, request_id),
    CONSTRAINT uk_order_no UNIQUE (order_no),
    CONSTRAINT ck_order_status CHECK (status IN ('processing', 'reserved', 'paid', 'confirmed', 'rejected', 'cancelled'))
);
CREATE INDEX orders_open_idx ON orders (updated_at) WHERE status IN ('processing', 'reserved', 'paid');

-- order_events: every status change, once, in order, with a per-order
-- sequence number; written in the transaction of the change.
CREATE TABLE order_events (
    order_id    uuid NOT NULL REFERENCES orders (order_id),
    seq         int NOT NULL CHECK (seq > 0),
    status      text NOT NULL CHECK (status IN ('processing', 'reserved', 'paid', 'confirmed', 'rejected', 'cancelled')),
    reason      text,
    occurred_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (order_id, seq)
);

-- processed_messages: a consumer's dedupe row, inserted in the transaction of
-- the effect it guards.
CREATE TABLE processed_messages (
    consumer     text NOT NULL,
    message_id   text NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);
CREATE INDEX processed_messages_processed_at_idx ON processed_messages (processed_at);

-- outbox: events to publish, written in the transaction of the change they
-- announce and published (then stamped) by the relay.
CREATE TABLE outbox (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    msg_id       text NOT NULL,
    event        text NOT NULL,
    payload      bytea NOT NULL,
    headers      jsonb NOT NULL DEFAULT '{}',
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_pending_idx ON outbox (id) WHERE published_at IS NULL;

-- +goose Down
DROP TABLE outbox;
DROP TABLE processed_messages;
DROP TABLE order_events;
DROP TABLE orders;
DROP TABLE api_clients;
