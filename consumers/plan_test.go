package consumers_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/consumers"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/order"
	"orderpipe/shared/outbox"
	"orderpipe/shared/postgres"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// grownTables are the tables the steps read and write, which
// TestGenericPlansStayOnTheKeysAsTheTablesGrow grows.
var grownTables = []string{"orders", "order_events", "outbox", "payments", "reservations", "inventory", "processed_messages", "webhook_deliveries"}

// TestGenericPlansStayOnTheKeysAsTheTablesGrow: the steps run their
// statements on generic plans (postgres.GenericPlans), made on the first
// run, while the tables are nearly empty, and kept by the connection.
// The orders have a callback, so the notifier's statements run too.
// Every table the steps touch then grows by 20,000 rows, and orders go
// through the same connection again: none of its statements may read a
// table or an index whole. A statement whose generic plan is a full scan
// (a plain join of unnest with a table) fails it with hundreds of
// thousands of rows read; one that scans a partial index whole (the
// payment step's record on the unsettled payments' index, which keeps an
// entry for every payment's pending version until a vacuum) with tens of
// thousands of index entries read.
func TestGenericPlansStayOnTheKeysAsTheTablesGrow(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	e.Stock(t, "SKU-1", 1000)
	ctx := t.Context()
	// The pipeline's own pool of one connection: every statement of the
	// steps is planned on it, once, in the first orders.
	one, err := postgres.OpenSized(context.Background(), e.DB.URL, 1)
	if err != nil {
		t.Fatal(err)
	}
	e.App.Pool = one
	// Every payment is pending before it succeeds; until a vacuum, the
	// partial index of unsettled payments keeps an entry for each pending
	// version. No autovacuum on payments, so that the entries stay; set
	// before the first orders, since it makes the connection plan again.
	if _, err := e.DB.Pool.Exec(ctx, `ALTER TABLE payments SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
	steps, err := consumers.Steps(e.App)
	if err != nil {
		t.Fatal(err)
	}
	r := pipetest.Start(t, e.App, pipetest.Config(), steps...)
	relay := &outbox.Relay{Pool: e.DB.Pool, JS: e.App.JS, Topology: e.App.Topology, Logger: e.App.Logger}
	run := func(n int) {
		t.Helper()
		for range n {
			// With a callback, so that the notifier writes its deliveries.
			id, event := e.InsertOrder(t, "3.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
			if _, err := e.DB.Pool.Exec(ctx, `UPDATE orders SET callback_url = 'http://127.0.0.1:9/hook' WHERE order_id = $1`, id); err != nil {
				t.Fatal(err)
			}
			if err := relay.Publish(ctx, event); err != nil {
				t.Fatal(err)
			}
			testenv.WaitFor(t, 30*time.Second, "order "+id.String()+" confirmed", func() bool { return e.Status(t, id) == order.StatusConfirmed })
		}
	}
	run(8)

	const grown = 20000
	// The growth runs on a connection of its own, closed before the
	// counters are read: a backend reports all of its counters as it ends
	// (its foreign key checks read orders' index).
	grow, err := postgres.OpenSized(context.Background(), e.DB.URL, 1)
	if err != nil {
		t.Fatal(err)
	}
	testenv.GrowOrders(t, grow, e.ClientID, grown)
	for _, q := range []string{
		`INSERT INTO order_events (order_id, seq, status) SELECT order_id, 1, 'confirmed' FROM orders WHERE starts_with(request_id, 'grown-')`,
		`INSERT INTO outbox (msg_id, event, payload, order_id, published_at)
		 SELECT 'grown-' || order_id, 'order.confirmed', '\x00', order_id, now() FROM orders WHERE starts_with(request_id, 'grown-')`,
		// Pending first, then succeeded, as every payment.
		`INSERT INTO payments (order_id, idempotency_key, amount, currency, status)
		 SELECT order_id, 'grown-' || order_id, 1, 'CNY', 'pending' FROM orders WHERE starts_with(request_id, 'grown-')`,
		`UPDATE payments SET status = 'succeeded', charge_id = 'grown-' || order_id WHERE starts_with(idempotency_key, 'grown-')`,
		`INSERT INTO inventory (sku, available) SELECT 'GROWN-' || g, 1 FROM generate_series(1, 20000) g`,
		`INSERT INTO reservations (order_id, sku, quantity)
		 SELECT order_id, 'GROWN-' || row_number() OVER (), 1 FROM orders WHERE starts_with(request_id, 'grown-')`,
		`INSERT INTO webhook_deliveries (webhook_id, order_id, seq, client_id, url, payload, status)
		 SELECT 'grown-' || order_id, order_id, 1, client_id, 'http://127.0.0.1:9/hook', '{}', 'delivered' FROM orders WHERE starts_with(request_id, 'grown-')`,
		`INSERT INTO processed_messages (consumer, message_id) SELECT c, 'grown-' || g FROM generate_series(1, 20000) g, unnest(ARRAY['inventory', 'payment', 'confirm', 'notify']) c`,
	} {
		if _, err := grow.Exec(ctx, q); err != nil {
			t.Fatalf("grow: %v\n%s", err, q)
		}
	}
	closeReported(t, e.DB, grow, "the growth's backend")
	before := fullScans(t, e.DB, grown)
	run(8)
	r.Stop(t)
	closeReported(t, e.DB, one, "the pipeline's backend")
	after := fullScans(t, e.DB, 0)
	var deliveries int
	if err := e.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE NOT starts_with(webhook_id, 'grown-')`).Scan(&deliveries); err != nil || deliveries < 16 {
		t.Fatalf("the notifier wrote %d deliveries (%v), want at least one per order", deliveries, err)
	}
	for name, n := range after {
		if n -= before[name]; n >= grown {
			t.Errorf("8 orders read %d entries of %s in full scans after it grew by %d; want every row found through a key", n, name, grown)
		}
	}
}

// closeReported closes pool, a pool of one connection, and waits until
// its backend is gone: a backend reports its last counters as it ends.
func closeReported(t *testing.T, db *testenv.Database, pool *pgxpool.Pool, what string) {
	t.Helper()
	var pid int
	if err := pool.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	pool.Close()
	testenv.WaitFor(t, 30*time.Second, what+" gone", func() bool {
		var n int
		return db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&n) == nil && n == 0
	})
}

// fullScans returns the rows read by full scans of each of grownTables
// and the entries read from each of their indexes ("table.index"), once
// every table's counter shows at least atLeast rows inserted (the growth
// reported).
func fullScans(t *testing.T, db *testenv.Database, atLeast int64) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	testenv.WaitFor(t, 30*time.Second, "the tables' counters", func() bool {
		indexes, err := db.Pool.Query(t.Context(), `SELECT relname || '.' || indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = ANY($1)`, grownTables)
		if err != nil {
			return false
		}
		for indexes.Next() {
			var name string
			var read int64
			if indexes.Scan(&name, &read) != nil {
				return false
			}
			out[name] = read
		}
		if indexes.Err() != nil {
			return false
		}
		rows, err := db.Pool.Query(t.Context(), `SELECT relname, n_tup_ins, seq_tup_read FROM pg_stat_user_tables WHERE relname = ANY($1)`, grownTables)
		if err != nil {
			return false
		}
		defer rows.Close()
		n := 0
		for rows.Next() {
			var name string
			var ins, read int64
			if rows.Scan(&name, &ins, &read) != nil || ins < atLeast {
				return false
			}
			out[name] = read
			n++
		}
		return rows.Err() == nil && n == len(grownTables)
	})
	return out
}
