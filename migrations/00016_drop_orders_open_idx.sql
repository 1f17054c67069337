-- +goose NO TRANSACTION
-- +goose Up
-- orders_open_idx (updated_at of the open orders, 00001) has served no
-- statement since the compensator walks the open orders by order_id
-- (orders_open_id_idx, 00005): its stuck deadline compares
-- greatest(updated_at, redriven_at), which no index on updated_at serves.
-- It still took an entry at every insert and at every status change of an
-- open order (each is a new row version): three per order on its way to
-- confirmed. CONCURRENTLY, outside a transaction: writes go on.
DROP INDEX CONCURRENTLY IF EXISTS orders_open_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS orders_open_idx;
CREATE INDEX CONCURRENTLY orders_open_idx ON orders (updated_at) WHERE status IN ('processing', 'reserved', 'paid');
