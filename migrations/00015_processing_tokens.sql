-- +goose NO TRANSACTION
-- +goose Up
-- The compensator settles tokens whose holder died (idemtoken.Settle) at
-- every pass: two statements over the processing tokens, which read the
-- whole table without an index of their own. A used token lives as long as
-- its order, so that table grows like orders for a client that uses tokens.
-- CONCURRENTLY, outside a transaction: the build does not block writes. A
-- build that failed leaves an invalid index behind, so a run of this
-- migration drops any index of that name first.
DROP INDEX CONCURRENTLY IF EXISTS idempotency_tokens_processing;
CREATE INDEX CONCURRENTLY idempotency_tokens_processing ON idempotency_tokens (claimed_until) WHERE state = 'processing';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS idempotency_tokens_processing;
