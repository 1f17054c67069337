package chaos

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"orderpipe/shared/postgres"
)

// CheckOptions say what the checker knows besides the database.
type CheckOptions struct {
	// InitialStock is each SKU's stock before the run; nil skips the
	// conservation check.
	InitialStock map[string]int64
	// Accepted maps every request_id a client got a 2xx for to the order
	// id it was answered; nil skips the clients' view.
	Accepted map[string]string
	// Sent holds every request_id (or token) a client sent; nil skips the
	// check that each order was asked for. (One order per request_id is
	// the schema's unique key, which no run can break; an order that no
	// client asked for, or under a request_id it did not send, can be.)
	Sent map[string]bool
	// Received returns the webhook ids the clients' receiver verified,
	// with the order each carried; nil skips the receiver's view. It is
	// called after the delivered rows are read: a delivery is recorded
	// only after the receiver answered, so every row read then is already
	// in the receiver's view, even while workers still deliver.
	Received func() map[string]string
}

// Invariant is one checked property and the orders that break it.
type Invariant struct {
	Name    string   `json:"name"`
	Checked int      `json:"checked"`
	Broken  []Broken `json:"broken,omitempty"`
}

// Broken is one order (or row) that breaks an invariant.
type Broken struct {
	OrderID string `json:"order_id,omitempty"`
	Detail  string `json:"detail"`
}

// Report is the checker's result.
type Report struct {
	Orders     int         `json:"orders"`
	Invariants []Invariant `json:"invariants"`
}

// OK reports whether every invariant held.
func (r Report) OK() bool {
	for _, i := range r.Invariants {
		if len(i.Broken) > 0 {
			return false
		}
	}
	return true
}

// Print writes the table of invariants and, for each broken one, up to 20
// of the orders that break it.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "%d orders checked\n", r.Orders)
	fmt.Fprintf(w, "%-62s %8s %8s\n", "invariant", "checked", "broken")
	for _, i := range r.Invariants {
		fmt.Fprintf(w, "%-62s %8d %8d\n", i.Name, i.Checked, len(i.Broken))
	}
	for _, i := range r.Invariants {
		for n, b := range i.Broken {
			if n == 20 {
				fmt.Fprintf(w, "  … %d more\n", len(i.Broken)-20)
				break
			}
			fmt.Fprintf(w, "  BROKEN %s: order %s: %s\n", i.Name, b.OrderID, b.Detail)
		}
	}
}

// BrokenOrders lists the orders that break any invariant.
func (r Report) BrokenOrders() []string {
	seen := map[string]bool{}
	var out []string
	for _, i := range r.Invariants {
		for _, b := range i.Broken {
			if b.OrderID != "" && !seen[b.OrderID] {
				seen[b.OrderID] = true
				out = append(out, b.OrderID)
			}
		}
	}
	sort.Strings(out)
	return out
}

// check is one invariant as a query over every order: checked counts what
// it looked at, broken returns (order id, detail) for each violation.
type check struct {
	name    string
	checked string
	broken  string
	// provider: needs the provider stand-in's tables (psp_charges).
	provider bool
}

// charges and refunds per order at the provider stand-in.
const money = `
	WITH c AS (SELECT reference, count(*) FILTER (WHERE state = 'succeeded') AS charged FROM psp_charges GROUP BY reference),
	     r AS (SELECT ch.reference, count(*) AS refunded FROM psp_refunds rf JOIN psp_charges ch ON ch.charge_id = rf.charge_id
	           WHERE rf.state = 'succeeded' GROUP BY ch.reference)
	SELECT o.order_id::text, o.status, coalesce(c.charged, 0) AS charged, coalesce(r.refunded, 0) AS refunded
	FROM orders o LEFT JOIN c ON c.reference = o.order_id::text LEFT JOIN r ON r.reference = o.order_id::text`

var checks = []check{
	{name: "every order is terminal",
		checked: `SELECT count(*) FROM orders`,
		broken:  `SELECT order_id::text, 'status ' || status FROM orders WHERE status NOT IN ('confirmed', 'rejected', 'cancelled')`},
	{name: "confirmed ⇔ exactly one succeeded charge and no refund", provider: true,
		checked: `SELECT count(*) FROM orders`,
		broken: `SELECT order_id, status || ': ' || charged || ' succeeded charge(s), ' || refunded || ' refund(s)' FROM (` + money + `) m
			WHERE (status = 'confirmed' AND (charged <> 1 OR refunded <> 0))
			   OR (status <> 'confirmed' AND charged > refunded)`},
	{name: "cancelled after a charge: one refund; before any: none", provider: true,
		checked: `SELECT count(*) FROM orders WHERE status IN ('cancelled', 'rejected')`,
		broken: `SELECT order_id, status || ': ' || charged || ' succeeded charge(s), ' || refunded || ' refund(s)' FROM (` + money + `) m
			WHERE status IN ('cancelled', 'rejected') AND (charged > 1 OR refunded <> charged)`},
	{name: "no payment left holding money for an unconfirmed order",
		checked: `SELECT count(*) FROM payments`,
		broken: `SELECT p.order_id::text, o.status || ' with payment ' || p.status FROM payments p JOIN orders o USING (order_id)
			WHERE o.status IN ('cancelled', 'rejected') AND p.status IN ('pending', 'succeeded')`},
	{name: "stock held only by confirmed orders",
		checked: `SELECT count(*) FROM reservations`,
		broken: `SELECT r.order_id::text, o.status || ' holds ' || r.quantity || ' of ' || r.sku FROM reservations r JOIN orders o USING (order_id)
			WHERE r.released_at IS NULL AND o.status <> 'confirmed'
			UNION ALL
			SELECT r.order_id::text, 'confirmed but its ' || r.sku || ' was released' FROM reservations r JOIN orders o USING (order_id)
			WHERE r.released_at IS NOT NULL AND o.status = 'confirmed'`},
	{name: "every status change has a delivered webhook",
		checked: `SELECT count(*) FROM order_events e JOIN orders o USING (order_id) WHERE o.callback_url IS NOT NULL`,
		broken: `SELECT e.order_id::text, 'change ' || e.seq || ' (' || e.status || '): ' || coalesce('webhook ' || d.status || ' after ' || d.attempts || ' attempt(s)', 'no webhook')
			FROM order_events e JOIN orders o USING (order_id)
			LEFT JOIN webhook_deliveries d ON d.order_id = e.order_id AND d.seq = e.seq
			WHERE o.callback_url IS NOT NULL AND (d.status IS NULL OR d.status <> 'delivered')`},
	{name: "every order placed with a token has its token used",
		checked: `SELECT count(*) FROM orders WHERE request_id LIKE 'opt1.%'`,
		broken: `SELECT o.order_id::text, 'token ' || o.request_id || ' is ' || coalesce(t.state || coalesce(' with order ' || t.order_id::text, ''), 'missing')
			FROM orders o LEFT JOIN idempotency_tokens t ON t.token = o.request_id
			WHERE o.request_id LIKE 'opt1.%' AND (t.state IS DISTINCT FROM 'used' OR t.order_id IS DISTINCT FROM o.order_id OR t.client_id <> o.client_id)`},
	{name: "nothing pending in the outbox",
		checked: `SELECT count(*) FROM outbox`,
		broken:  `SELECT coalesce(order_id::text, ''), 'event ' || msg_id || ' never published' FROM outbox WHERE published_at IS NULL`},
	{name: "every dead letter explained (replayed, or its order terminal)",
		checked: `SELECT count(*) FROM dead_letters`,
		broken: `SELECT coalesce(d.order_id::text, ''), d.consumer || ': ' || d.error FROM dead_letters d LEFT JOIN orders o ON o.order_id = d.order_id
			WHERE d.replayed_at IS NULL AND (o.order_id IS NULL OR o.status NOT IN ('confirmed', 'rejected', 'cancelled'))`},
}

// Check checks every invariant over every order of the database.
func Check(ctx context.Context, db postgres.DB, opts CheckOptions) (Report, error) {
	var rep Report
	if err := db.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&rep.Orders); err != nil {
		return rep, fmt.Errorf("count orders: %w", err)
	}
	var stand string
	if err := db.QueryRow(ctx, `SELECT coalesce(to_regclass('psp_charges')::text, '')`).Scan(&stand); err != nil {
		return rep, err
	}
	for _, c := range checks {
		if c.provider && stand == "" {
			continue
		}
		inv := Invariant{Name: c.name}
		if err := db.QueryRow(ctx, c.checked).Scan(&inv.Checked); err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		rows, err := db.Query(ctx, c.broken)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		inv.Broken, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Broken, error) {
			var b Broken
			return b, r.Scan(&b.OrderID, &b.Detail)
		})
		if err != nil {
			return rep, fmt.Errorf("%s: %w", c.name, err)
		}
		rep.Invariants = append(rep.Invariants, inv)
	}
	// The checks that need what the clients saw, each run only when opts
	// gives it, in this order.
	for _, c := range []struct {
		given bool
		check func() (Invariant, error)
	}{
		{opts.InitialStock != nil, func() (Invariant, error) { return checkStock(ctx, db, opts.InitialStock) }},
		{opts.Sent != nil, func() (Invariant, error) { return checkSent(ctx, db, opts.Sent) }},
		{opts.Accepted != nil, func() (Invariant, error) { return checkAccepted(ctx, db, opts.Accepted) }},
		{opts.Received != nil, func() (Invariant, error) { return checkReceived(ctx, db, opts.Received) }},
	} {
		if !c.given {
			continue
		}
		inv, err := c.check()
		if err != nil {
			return rep, err
		}
		rep.Invariants = append(rep.Invariants, inv)
	}
	return rep, nil
}

// checkStock: for every SKU, available + what confirmed orders hold (and
// open ones, which the terminal check already refuses) = the initial stock.
func checkStock(ctx context.Context, db postgres.DB, initial map[string]int64) (Invariant, error) {
	inv := Invariant{Name: "stock conserved: available + held = initial"}
	rows, err := db.Query(ctx, `
		SELECT i.sku, i.available, coalesce(sum(r.quantity) FILTER (WHERE r.released_at IS NULL), 0)::bigint
		FROM inventory i LEFT JOIN reservations r ON r.sku = i.sku GROUP BY i.sku, i.available`)
	if err != nil {
		return inv, fmt.Errorf("read stock: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var sku string
		var avail, held int64
		if err := rows.Scan(&sku, &avail, &held); err != nil {
			return inv, err
		}
		want, ok := initial[sku]
		if !ok {
			continue
		}
		inv.Checked++
		if avail+held != want {
			inv.Broken = append(inv.Broken, Broken{Detail: fmt.Sprintf("%s: available %d + held %d = %d, initial %d", sku, avail, held, avail+held, want)})
		}
	}
	return inv, rows.Err()
}

// checkSent: every order's request_id is one a client sent.
func checkSent(ctx context.Context, db postgres.DB, sent map[string]bool) (Invariant, error) {
	inv := Invariant{Name: "every order was asked for by a client"}
	rows, err := db.Query(ctx, `SELECT order_id::text, request_id FROM orders`)
	if err != nil {
		return inv, fmt.Errorf("read orders: %w", err)
	}
	var oid, rid string
	_, err = pgx.ForEachRow(rows, []any{&oid, &rid}, func() error {
		inv.Checked++
		if !sent[rid] {
			inv.Broken = append(inv.Broken, Broken{OrderID: oid, Detail: "request_id " + rid + " was never sent by a client"})
		}
		return nil
	})
	return inv, err
}

// checkAccepted: each request_id a client was answered 2xx for is exactly
// the one order it was told.
func checkAccepted(ctx context.Context, db postgres.DB, accepted map[string]string) (Invariant, error) {
	inv := Invariant{Name: "each accepted request_id is exactly its one order"}
	ids := make([]string, 0, len(accepted))
	for rid := range accepted {
		ids = append(ids, rid)
	}
	rows, err := db.Query(ctx, `SELECT request_id, array_agg(order_id::text) FROM orders WHERE request_id = ANY($1) GROUP BY request_id`, ids)
	if err != nil {
		return inv, fmt.Errorf("read accepted orders: %w", err)
	}
	found := map[string][]string{}
	var rid string
	var oids []string // each Scan gives it a new slice
	if _, err := pgx.ForEachRow(rows, []any{&rid, &oids}, func() error {
		found[rid] = oids
		return nil
	}); err != nil {
		return inv, err
	}
	for rid, oid := range accepted {
		inv.Checked++
		got := found[rid]
		switch {
		case len(got) == 0:
			inv.Broken = append(inv.Broken, Broken{OrderID: oid, Detail: "request_id " + rid + " was accepted but no order exists (an accepted order was lost)"})
		case len(got) > 1 || got[0] != oid:
			inv.Broken = append(inv.Broken, Broken{OrderID: oid, Detail: fmt.Sprintf("request_id %s was answered %s; the database has %s", rid, oid, strings.Join(got, ", "))})
		}
	}
	return inv, nil
}

// checkReceived: every delivered webhook reached the receiver and verified.
func checkReceived(ctx context.Context, db postgres.DB, receiver func() map[string]string) (Invariant, error) {
	inv := Invariant{Name: "every delivered webhook was received and verified"}
	rows, err := db.Query(ctx, `SELECT webhook_id, order_id::text FROM webhook_deliveries WHERE status = 'delivered'`)
	if err != nil {
		return inv, fmt.Errorf("read webhook deliveries: %w", err)
	}
	type delivered struct{ id, oid string }
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (delivered, error) {
		var d delivered
		return d, r.Scan(&d.id, &d.oid)
	})
	if err != nil {
		return inv, err
	}
	received := receiver()
	for _, d := range all {
		inv.Checked++
		if got, ok := received[d.id]; !ok {
			inv.Broken = append(inv.Broken, Broken{OrderID: d.oid, Detail: "webhook " + d.id + " is recorded delivered but the receiver never verified it"})
		} else if got != d.oid {
			inv.Broken = append(inv.Broken, Broken{OrderID: d.oid, Detail: fmt.Sprintf("webhook %s carried order %s", d.id, got)})
		}
	}
	return inv, nil
}
