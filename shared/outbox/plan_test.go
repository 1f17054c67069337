package outbox_test

import (
	"testing"

	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/testenv"
)

// TestPublishFindsItsRowsByKeyAsTheOutboxGrows: the publish's read and its
// stamp find their rows through the key however much the outbox grew since
// they first ran. PostgreSQL may cache a plan for a prepared statement
// after five runs; cached while the outbox was nearly empty, that plan
// scanned the whole table, and went on doing so as it grew, until the next
// ANALYZE invalidated it: in a fresh deployment's first minute every stamp
// read every row of the outbox.
func TestPublishFindsItsRowsByKeyAsTheOutboxGrows(t *testing.T) {
	db, env := testenv.DB(t), testenv.NATS(t)
	// The relay on one connection of its own, whose counters it flushes.
	one := testenv.OneConnection(t, db)
	r := &outbox.Relay{Pool: one, JS: env.JS, Topology: env.Topology, Logger: testenv.Logger(t)}
	publish := func(n int) {
		t.Helper()
		for range n {
			_, id := enqueue(t, db.Pool)
			if err := r.Publish(t.Context(), id); err != nil {
				t.Fatalf("publish: %v", err)
			}
		}
	}
	publish(10) // past the runs after which a plan may be cached
	const grown = 20000
	if _, err := db.Pool.Exec(t.Context(), `
		INSERT INTO outbox (msg_id, event, payload, published_at)
		SELECT 'grown-' || g, 'order.accepted', '\x00', now() FROM generate_series(1, $1) g`, grown); err != nil {
		t.Fatal(err)
	}
	publish(5)
	read := testenv.FullScanReads(t, db, one, "outbox", 15)
	if read >= grown {
		t.Errorf("the relay read %d outbox rows in full scans to publish 15 rows of %d; want its rows found through the key", read, grown+15)
	}
}
