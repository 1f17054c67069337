// Package stock owns the inventory and reservations tables: what is
// available per SKU, and what each order holds. The stock step
// (consumers/inventory) reserves through Reserve; the payment step and the
// compensator give an order's stock back through Release (or, for many orders in one
// transaction, Unreserve each and Restock them together), exactly once.
//
// Stock is conserved: for every SKU, the initial quantity equals available
// plus the quantities of reservations not released.
package stock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/shared/order"
)

// Line is one SKU of an order, summed over its items.
type Line struct {
	SKU string
	Qty int64
}

// Lines reads an order's items, summed per SKU and sorted by SKU (the lock
// order, so that two orders never deadlock on the same rows).
func Lines(raw []byte) ([]Line, error) {
	var items []order.Item
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, errors.New("no items")
	}
	sum := map[string]int64{}
	for _, it := range items {
		if it.SKU == "" || it.Quantity <= 0 {
			return nil, fmt.Errorf("bad item %+v", it)
		}
		sum[it.SKU] += int64(it.Quantity)
	}
	out := make([]Line, 0, len(sum))
	for sku, q := range sum {
		out = append(out, Line{sku, q})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SKU < out[j].SKU })
	return out, nil
}

// Reserve takes every line of an order from the stock, or none, in the
// caller's transaction: it locks the SKUs' rows in SKU order (so that two
// orders never deadlock), and returns the problems (unknown SKU, out of
// stock) when one line cannot be served, having taken nothing.
func Reserve(ctx context.Context, tx pgx.Tx, orderID uuid.UUID, ls []Line) (problems []string, err error) {
	ps, err := ReserveMany(ctx, tx, []Want{{OrderID: orderID, Lines: ls}})
	if err != nil {
		return nil, err
	}
	return ps[0], nil
}

// Want is one order's lines for ReserveMany.
type Want struct {
	OrderID uuid.UUID
	Lines   []Line
}

// ReserveMany is Reserve for many orders in one transaction, set-based: it
// locks the rows of every SKU that any of them names once, in SKU order,
// serves the orders in the order given (each all of its lines or none,
// from what the earlier ones left), and writes the stock and the
// reservations in one statement each. It returns each order's problems
// (none: reserved).
func ReserveMany(ctx context.Context, tx pgx.Tx, ws []Want) ([][]string, error) {
	var skus []string
	seen := map[string]bool{}
	for _, w := range ws {
		for _, l := range w.Lines {
			if !seen[l.SKU] {
				seen[l.SKU] = true
				skus = append(skus, l.SKU)
			}
		}
	}
	// The joins on "i.sku = ANY(ARRAY[v.sku])" keep the lock and the update
	// on the key in any cached plan, the generic one included (see
	// postgres.DB): the steps run them so.
	rows, err := tx.Query(ctx, `
		SELECT i.sku, i.available FROM unnest($1::text[]) AS v(sku) JOIN inventory i ON i.sku = ANY(ARRAY[v.sku])
		ORDER BY i.sku FOR UPDATE OF i`, skus)
	if err != nil {
		return nil, fmt.Errorf("lock stock of %d order(s): %w", len(ws), err)
	}
	avail := map[string]int64{}
	for rows.Next() {
		var sku string
		var n int64
		if err := rows.Scan(&sku, &n); err != nil {
			rows.Close()
			return nil, err
		}
		avail[sku] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lock stock of %d order(s): %w", len(ws), err)
	}
	out := make([][]string, len(ws))
	taken := map[string]int64{}
	var rOrders []uuid.UUID
	var rSKUs []string
	var rQty []int64
	for i, w := range ws {
		for _, l := range w.Lines {
			n, ok := avail[l.SKU]
			switch {
			case !ok:
				out[i] = append(out[i], fmt.Sprintf("unknown sku %s", l.SKU))
			case n < l.Qty:
				out[i] = append(out[i], fmt.Sprintf("out of stock: %s (wanted %d, available %d)", l.SKU, l.Qty, n))
			}
		}
		if len(out[i]) > 0 {
			continue
		}
		for _, l := range w.Lines {
			avail[l.SKU] -= l.Qty
			taken[l.SKU] += l.Qty
			rOrders, rSKUs, rQty = append(rOrders, w.OrderID), append(rSKUs, l.SKU), append(rQty, l.Qty)
		}
	}
	if len(rOrders) == 0 {
		return out, nil
	}
	tSKUs := make([]string, 0, len(taken))
	for sku := range taken {
		tSKUs = append(tSKUs, sku)
	}
	sort.Strings(tSKUs)
	tQty := make([]int64, len(tSKUs))
	for i, sku := range tSKUs {
		tQty[i] = taken[sku]
	}
	if _, err := tx.Exec(ctx, `
		UPDATE inventory i SET available = i.available - v.qty, updated_at = now()
		FROM unnest($1::text[], $2::bigint[]) AS v(sku, qty) WHERE i.sku = ANY(ARRAY[v.sku])`, tSKUs, tQty); err != nil {
		return nil, fmt.Errorf("take the stock of %d order(s): %w", len(ws), err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO reservations (order_id, sku, quantity)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::bigint[])`, rOrders, rSKUs, rQty); err != nil {
		return nil, fmt.Errorf("reserve the stock of %d order(s): %w", len(ws), err)
	}
	return out, nil
}

// Release gives back the stock that an order still holds, in the caller's
// transaction, and returns how many reservation lines it released. Each
// line is released exactly once however often Release runs (released_at is
// set by a conditional update), so the compensator and the payment step
// may both call it. It is Unreserve then Restock.
func Release(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (int, error) {
	ls, err := Unreserve(ctx, tx, orderID)
	if err != nil {
		return 0, err
	}
	if err := Restock(ctx, tx, ls); err != nil {
		return 0, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	return len(ls), nil
}

// Unreserve marks the reservations an order still holds released, in the
// caller's transaction, and returns their lines: stock that the same
// transaction must give back with Restock before it commits (until then
// the stock is neither held nor available). It locks no inventory row, so a
// caller that releases many orders in one transaction (the compensator's
// batch) can Restock them all at its end, each SKU once, in SKU order.
func Unreserve(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) ([]Line, error) {
	rows, err := tx.Query(ctx, `
		UPDATE reservations SET released_at = now()
		WHERE order_id = $1 AND released_at IS NULL
		RETURNING sku, quantity`, orderID)
	if err != nil {
		return nil, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	ls, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Line, error) {
		var l Line
		return l, r.Scan(&l.SKU, &l.Qty)
	})
	if err != nil {
		return nil, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	return ls, nil
}

// Restock adds lines back to the available stock, in the caller's
// transaction: each SKU once, with its lines summed, in SKU order — the
// order in which Reserve locks them, so two transactions that lock stock
// never wait for each other in a cycle.
func Restock(ctx context.Context, tx pgx.Tx, ls []Line) error {
	sum := map[string]int64{}
	for _, l := range ls {
		sum[l.SKU] += l.Qty
	}
	skus := make([]string, 0, len(sum))
	for sku := range sum {
		skus = append(skus, sku)
	}
	sort.Strings(skus)
	for _, sku := range skus {
		if _, err := tx.Exec(ctx, `UPDATE inventory SET available = available + $2, updated_at = now() WHERE sku = $1`, sku, sum[sku]); err != nil {
			return fmt.Errorf("give back %d of %s: %w", sum[sku], sku, err)
		}
	}
	return nil
}

// ErrBadSKU is returned for a SKU outside order.SKUPattern, which no order
// could name.
var ErrBadSKU = errors.New("sku must be 1-64 characters of A-Z a-z 0-9 . _ -")

// ValidSKU returns ErrBadSKU for a SKU that Set refuses: one that an
// order's items could not name (order.ValidSKU).
func ValidSKU(sku string) error {
	if !order.ValidSKU(sku) {
		return ErrBadSKU
	}
	return nil
}

// Set sets the available quantity of a SKU (creating it).
func Set(ctx context.Context, pool *pgxpool.Pool, sku string, available int64) error {
	if err := ValidSKU(sku); err != nil {
		return err
	}
	if available < 0 {
		return errors.New("quantity must not be negative")
	}
	_, err := pool.Exec(ctx, `
		INSERT INTO inventory (sku, available) VALUES ($1, $2)
		ON CONFLICT (sku) DO UPDATE SET available = EXCLUDED.available, updated_at = now()`, sku, available)
	if err != nil {
		return fmt.Errorf("set stock of %s: %w", sku, err)
	}
	return nil
}

// Level is one SKU's stock.
type Level struct {
	SKU       string `json:"sku"`
	Available int64  `json:"available"`
	Reserved  int64  `json:"reserved"`
}

// List returns every SKU with its available and held quantities.
func List(ctx context.Context, pool *pgxpool.Pool) ([]Level, error) {
	rows, err := pool.Query(ctx, `
		SELECT i.sku, i.available, coalesce(sum(r.quantity) FILTER (WHERE r.released_at IS NULL), 0)::bigint
		FROM inventory i LEFT JOIN reservations r ON r.sku = i.sku
		GROUP BY i.sku, i.available
		ORDER BY length(i.sku), i.sku`)
	if err != nil {
		return nil, fmt.Errorf("list stock: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Level, error) {
		var l Level
		err := r.Scan(&l.SKU, &l.Available, &l.Reserved)
		return l, err
	})
}

// Seed stocks SKU-1 … SKU-100 with 1,000,000 units each, leaving SKUs that
// exist alone (the dev seed).
func Seed(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `
		INSERT INTO inventory (sku, available)
		SELECT 'SKU-' || n, 1000000 FROM generate_series(1, 100) AS n
		ON CONFLICT (sku) DO NOTHING`)
	if err != nil {
		return fmt.Errorf("seed inventory: %w", err)
	}
	return nil
}
