package notify_test

import (
	"testing"
	"time"

	"orderpipe/consumers/notify"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// TestNoCallbackNoTransaction: the events of an order without a callback
// URL are acked by the notifier with no dedupe row and no delivery (there is
// nothing to do once), while an order with one still gets its delivery.
func TestNoCallbackNoTransaction(t *testing.T) {
	t.Parallel()
	e := pipetest.New(t, pspserver.Options{})
	pipetest.Start(t, e.App, pipetest.Config(), notify.Step(e.DB.Pool))
	ctx := t.Context()
	relay := &outbox.Relay{Pool: e.DB.Pool, JS: e.App.JS, Topology: e.App.Topology, Logger: e.App.Logger}
	_, silent := e.InsertOrder(t, "1.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	hooked, loud := e.InsertOrder(t, "1.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	if _, err := e.DB.Pool.Exec(ctx, `UPDATE orders SET callback_url = 'https://shop.example/h' WHERE order_id = $1`, hooked); err != nil {
		t.Fatal(err)
	}
	if err := relay.Publish(ctx, silent, loud); err != nil {
		t.Fatal(err)
	}
	cons, err := e.App.JS.Consumer(ctx, e.App.Topology.Stream, notify.Name)
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, "both events acked by the notifier", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Consumer == 2 && info.NumAckPending == 0 && info.NumPending == 0
	})
	var dedupe, deliveries int
	if err := e.DB.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM processed_messages WHERE consumer = $1),
		(SELECT count(*) FROM webhook_deliveries)`, notify.Name).Scan(&dedupe, &deliveries); err != nil {
		t.Fatal(err)
	}
	if dedupe != 1 || deliveries != 1 {
		t.Fatalf("%d dedupe rows and %d deliveries, want 1 and 1 (the order with a callback URL only)", dedupe, deliveries)
	}
}
