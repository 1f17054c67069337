-- +goose Up
-- Each client's own rate limit at the intake (requests per second, and the
-- burst of its token bucket); NULL means the process default
-- (ORDERPIPE_RATE_LIMIT, ORDERPIPE_RATE_BURST). Set with `orderpipe clients
-- create --rate-limit R --burst B` or `clients set-rate-limit`.
ALTER TABLE api_clients
    ADD COLUMN rate_limit double precision CHECK (rate_limit > 0),
    ADD COLUMN rate_burst integer CHECK (rate_burst > 0);

-- +goose Down
ALTER TABLE api_clients DROP COLUMN rate_limit, DROP COLUMN rate_burst;
