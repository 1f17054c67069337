-- +goose Up
-- The fence of a webhook claim: every claim draws a new lease_token, and a
-- worker records its outcome only while the row still carries the token
-- it claimed with. A worker paused past its lease (the row was claimed
-- again) or a `webhooks resend` (which clears the token) makes a late
-- outcome change nothing.
ALTER TABLE webhook_deliveries ADD COLUMN lease_token uuid;

-- +goose Down
ALTER TABLE webhook_deliveries DROP COLUMN lease_token;
