-- +goose Up
-- inventory: what can still be reserved, per SKU. The CHECK is the last line
-- against overselling: a reservation that would go below zero fails.
CREATE TABLE inventory (
    sku        text PRIMARY KEY CHECK (length(sku) BETWEEN 1 AND 64),
    available  bigint NOT NULL CHECK (available >= 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- reservations: the stock an order holds, one row per (order, sku), written
-- in the transaction that moves the order to reserved. released_at is set
-- exactly once, by the transaction that gives the quantity back.
CREATE TABLE reservations (
    order_id    uuid NOT NULL REFERENCES orders (order_id),
    sku         text NOT NULL REFERENCES inventory (sku),
    quantity    bigint NOT NULL CHECK (quantity > 0),
    reserved_at timestamptz NOT NULL DEFAULT now(),
    released_at timestamptz,
    PRIMARY KEY (order_id, sku)
);
CREATE INDEX reservations_held_idx ON reservations (sku) WHERE released_at IS NULL;

-- payments: our side of the payment provider. The row is written as
-- 'pending' before the provider is called, so that anyone who finds it knows
-- a charge may exist under idempotency_key; the outcome is recorded in the
-- transaction that moves the order.
CREATE TABLE payments (
    order_id        uuid PRIMARY KEY REFERENCES orders (order_id),
    idempotency_key text NOT NULL,
    amount          numeric(20, 2) NOT NULL CHECK (amount > 0),
    currency        text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status          text NOT NULL CHECK (status IN ('pending', 'succeeded', 'declined', 'refunded')),
    charge_id       text,
    decline_reason  text,
    refund_key      text,
    refund_id       text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    refunded_at     timestamptz,
    CONSTRAINT uk_payment_key UNIQUE (idempotency_key),
    CONSTRAINT ck_payment_charge CHECK (status NOT IN ('succeeded', 'refunded') OR charge_id IS NOT NULL),
    CONSTRAINT ck_payment_refund CHECK (status <> 'refunded' OR refund_id IS NOT NULL)
);

-- dead_letters: messages a consumer gave up on (permanent error or retries
-- exhausted). JetStream has no dead-letter queue of its own; the order is
-- left to the compensator and an operator may replay the message.
CREATE TABLE dead_letters (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer    text NOT NULL,
    message_id  text NOT NULL,
    subject     text NOT NULL,
    payload     bytea NOT NULL,
    headers     jsonb NOT NULL DEFAULT '{}',
    error       text NOT NULL,
    attempts    int NOT NULL CHECK (attempts >= 0),
    order_id    uuid,
    created_at  timestamptz NOT NULL DEFAULT now(),
    replayed_at timestamptz,
    replays     int NOT NULL DEFAULT 0
);
CREATE INDEX dead_letters_order_idx ON dead_letters (order_id) WHERE order_id IS NOT NULL;
CREATE INDEX dead_letters_open_idx ON dead_letters (created_at) WHERE replayed_at IS NULL;

-- psp_charges and psp_refunds belong to the payment provider stand-in
-- (`orderpipe psp`), not to orderpipe: they play the provider's own storage.
-- One row per Idempotency-Key; the first answer is kept and returned for
-- every repeat of the key. state 'in_flight' answers 409 to a concurrent
-- repeat; fingerprint catches a key reused with another body.
CREATE TABLE psp_charges (
    idempotency_key text PRIMARY KEY CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint     bytea NOT NULL,
    state           text NOT NULL CHECK (state IN ('in_flight', 'succeeded', 'declined')),
    charge_id       text NOT NULL UNIQUE,
    amount          numeric(20, 2) NOT NULL,
    currency        text NOT NULL,
    reference       text NOT NULL,
    reason          text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz
);
CREATE INDEX psp_charges_reference_idx ON psp_charges (reference);

CREATE TABLE psp_refunds (
    idempotency_key text PRIMARY KEY CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    fingerprint     bytea NOT NULL,
    state           text NOT NULL CHECK (state IN ('in_flight', 'succeeded')),
    refund_id       text NOT NULL UNIQUE,
    charge_id       text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz
);
-- A charge is refunded at most once, whatever the keys.
CREATE UNIQUE INDEX psp_refunds_one_per_charge ON psp_refunds (charge_id);

-- +goose Down
DROP TABLE psp_refunds;
DROP TABLE psp_charges;
DROP TABLE dead_letters;
DROP TABLE payments;
DROP TABLE reservations;
DROP TABLE inventory;
