// Package inventory is the stock step: on orders.accepted it reserves every
// line of the order or none, and moves the order to reserved, or to
// rejected with the reason (out of stock, unknown SKU). Release gives an
// order's stock back exactly once (a declined payment, the compensator).
//
// Stock is conserved: for every SKU, the initial quantity equals available
// plus the quantities of reservations not released.
package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/consumers/step"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
)

// Name is the step's durable consumer name.
const Name = "inventory"

// Step returns the stock step.
func Step() step.Step {
	return step.TxStep(Name, []orderevent.Name{orderevent.Accepted}, func(ctx context.Context, tx pgx.Tx, m step.Message) ([]int64, error) {
		return reserve(ctx, tx, m.Event.OrderID)
	})
}

type line struct {
	sku string
	qty int64
}

// lines reads an order's items, summed per SKU and sorted by SKU (the lock
// order, so that two orders never deadlock on the same rows).
func lines(raw []byte) ([]line, error) {
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
	out := make([]line, 0, len(sum))
	for sku, q := range sum {
		out = append(out, line{sku, q})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].sku < out[j].sku })
	return out, nil
}

// reserve runs in the step's transaction.
func reserve(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) ([]int64, error) {
	status, err := step.LockStatus(ctx, tx, orderID)
	if err != nil {
		return nil, err
	}
	if status != order.StatusProcessing {
		return nil, nil // moved on (a late or repeated message, or the compensator): nothing to do
	}
	var raw []byte
	if err := tx.QueryRow(ctx, `SELECT items FROM orders WHERE order_id = $1`, orderID).Scan(&raw); err != nil {
		return nil, fmt.Errorf("read items of order %s: %w", orderID, err)
	}
	ls, err := lines(raw)
	if err != nil {
		return nil, step.Permanent(fmt.Errorf("items of order %s: %w", orderID, err))
	}
	skus := make([]string, len(ls))
	for i, l := range ls {
		skus[i] = l.sku
	}
	rows, err := tx.Query(ctx, `SELECT sku, available FROM inventory WHERE sku = ANY($1) ORDER BY sku FOR UPDATE`, skus)
	if err != nil {
		return nil, fmt.Errorf("lock stock of order %s: %w", orderID, err)
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
		return nil, fmt.Errorf("lock stock of order %s: %w", orderID, err)
	}
	var problems []string
	for _, l := range ls {
		n, ok := avail[l.sku]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("unknown sku %s", l.sku))
		case n < l.qty:
			problems = append(problems, fmt.Sprintf("out of stock: %s (wanted %d, available %d)", l.sku, l.qty, n))
		}
	}
	if len(problems) > 0 {
		moved, err := orderstore.Transition(ctx, tx, orderID, order.StatusProcessing, order.StatusRejected, strings.Join(problems, "; "))
		if err != nil {
			return nil, err
		}
		return ids(moved), nil
	}
	for _, l := range ls {
		if _, err := tx.Exec(ctx, `UPDATE inventory SET available = available - $2, updated_at = now() WHERE sku = $1`, l.sku, l.qty); err != nil {
			return nil, fmt.Errorf("take %d of %s for order %s: %w", l.qty, l.sku, orderID, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO reservations (order_id, sku, quantity) VALUES ($1, $2, $3)`, orderID, l.sku, l.qty); err != nil {
			return nil, fmt.Errorf("reserve %s for order %s: %w", l.sku, orderID, err)
		}
	}
	moved, err := orderstore.Transition(ctx, tx, orderID, order.StatusProcessing, order.StatusReserved, "")
	if err != nil {
		return nil, err
	}
	return ids(moved), nil
}

func ids(m orderstore.Moved) []int64 {
	if !m.OK {
		return nil
	}
	return []int64{m.OutboxID}
}

// Release gives back the stock that an order still holds, in the caller's
// transaction, and returns how many reservation lines it released. Each
// line is released exactly once however often Release runs (released_at is
// set by a conditional update), so the compensator and the payment step
// may both call it.
func Release(ctx context.Context, tx pgx.Tx, orderID uuid.UUID) (int, error) {
	rows, err := tx.Query(ctx, `
		UPDATE reservations SET released_at = now()
		WHERE order_id = $1 AND released_at IS NULL
		RETURNING sku, quantity`, orderID)
	if err != nil {
		return 0, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	var ls []line
	for rows.Next() {
		var l line
		if err := rows.Scan(&l.sku, &l.qty); err != nil {
			rows.Close()
			return 0, err
		}
		ls = append(ls, l)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("release stock of order %s: %w", orderID, err)
	}
	sort.Slice(ls, func(i, j int) bool { return ls[i].sku < ls[j].sku })
	for _, l := range ls {
		if _, err := tx.Exec(ctx, `UPDATE inventory SET available = available + $2, updated_at = now() WHERE sku = $1`, l.sku, l.qty); err != nil {
			return 0, fmt.Errorf("give back %d of %s from order %s: %w", l.qty, l.sku, orderID, err)
		}
	}
	return len(ls), nil
}

// skuRe is what `inventory set` accepts as a SKU.
var skuRe = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,64}$`)

// ErrBadSKU is returned for a SKU outside [A-Za-z0-9._:-]{1,64}.
var ErrBadSKU = errors.New("sku must be 1-64 characters of A-Z a-z 0-9 . _ : -")

// ValidSKU returns ErrBadSKU for a SKU that Set refuses.
func ValidSKU(sku string) error {
	if !skuRe.MatchString(sku) {
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
