package notify_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"orderpipe/consumers/notify"
	"orderpipe/consumers/webhook"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func newOrder(t *testing.T, pool *pgxpool.Pool, callback string) order.Order {
	t.Helper()
	ctx := t.Context()
	c, err := tenant.Create(ctx, pool, "notify-test")
	if err != nil {
		t.Fatal(err)
	}
	amount, _ := order.ParseAmount("39.98")
	res, err := orderstore.Insert(ctx, pool, c.ClientID, order.CreateRequest{
		RequestID: order.NewRequestID(time.Now()), UserID: 42, Items: []order.Item{{SKU: "SKU-1", Quantity: 2}},
		Amount: amount, Currency: "CNY", CallbackURL: callback,
	}, orderstore.InsertOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return res.Order
}

func event(o order.Order, s order.Status, redrive int) orderevent.Event {
	return orderevent.Event{Version: orderevent.Version, Name: orderevent.ForStatus(s), OrderID: o.ID, ClientID: o.ClientID,
		RequestID: o.RequestID, Status: s, OccurredAt: time.Now(), Redrive: redrive}
}

// handle is the router's pattern: the dedupe row and Apply in one
// transaction; zero rows means already done.
func handle(t *testing.T, pool *pgxpool.Pool, ev orderevent.Event) (bool, error) {
	t.Helper()
	var created bool
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		tag, err := tx.Exec(t.Context(), `INSERT INTO processed_messages (consumer, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, notify.Name, ev.MsgID())
		if err != nil || tag.RowsAffected() == 0 {
			return err
		}
		created, err = notify.Apply(t.Context(), tx, ev)
		return err
	})
	return created, err
}

func move(t *testing.T, pool *pgxpool.Pool, id uuid.UUID, from, to order.Status, reason string) {
	t.Helper()
	if err := testenv.Move(t.Context(), pool, id, from, to, reason); err != nil {
		t.Fatal(err)
	}
}

// cancelledOrder is an order with a callback that went processing,
// reserved, cancelled (payment declined).
func cancelledOrder(t *testing.T, pool *pgxpool.Pool) order.Order {
	t.Helper()
	o := newOrder(t, pool, "https://shop.example/hooks")
	move(t, pool, o.ID, order.StatusProcessing, order.StatusReserved, "")
	move(t, pool, o.ID, order.StatusReserved, order.StatusCancelled, "payment declined")
	return o
}

// checkNoDeliveries fails the test if any webhook delivery is stored.
func checkNoDeliveries(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM webhook_deliveries`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d deliveries, %v", n, err)
	}
}

func TestApplyStoresOneDeliveryPerStatusChange(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	o := cancelledOrder(t, db.Pool)
	statuses := []order.Status{order.StatusProcessing, order.StatusReserved, order.StatusCancelled}
	for _, s := range statuses {
		if created, err := handle(t, db.Pool, event(o, s, 0)); err != nil || !created {
			t.Fatalf("%s: created=%v err=%v", s, created, err)
		}
		// A redelivery: the dedupe row stops it.
		if created, err := handle(t, db.Pool, event(o, s, 0)); err != nil || created {
			t.Fatalf("%s redelivered: created=%v err=%v", s, created, err)
		}
		// A re-drive has a new message id, but the same webhook id.
		if created, err := handle(t, db.Pool, event(o, s, 1)); err != nil || created {
			t.Fatalf("%s re-driven: created=%v err=%v", s, created, err)
		}
	}
	ds, err := webhook.List(t.Context(), db.Pool, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != len(statuses) {
		t.Fatalf("%d deliveries, want %d", len(ds), len(statuses))
	}
	for i, d := range ds {
		if d.Seq != i+1 || d.WebhookID != webhook.ID(o.ID, i+1) || d.URL != "https://shop.example/hooks" || d.Status != webhook.StatusPending {
			t.Errorf("delivery %d: %+v", i, d)
		}
		var p struct {
			Type      string    `json:"type"`
			Timestamp time.Time `json:"timestamp"`
			Data      struct {
				OrderID   uuid.UUID    `json:"order_id"`
				RequestID string       `json:"request_id"`
				Status    order.Status `json:"status"`
				Reason    string       `json:"reason"`
				Seq       int          `json:"seq"`
				Amount    string       `json:"amount"`
				ClientID  *string      `json:"client_id"`
			} `json:"data"`
		}
		if err := json.Unmarshal(d.Payload, &p); err != nil {
			t.Fatal(err)
		}
		if p.Type != "order.status_changed" || p.Timestamp.IsZero() || p.Data.OrderID != o.ID || p.Data.Status != statuses[i] ||
			p.Data.Seq != i+1 || p.Data.Amount != "39.98" || p.Data.RequestID != o.RequestID || p.Data.ClientID != nil {
			t.Errorf("payload %d: %s", i, d.Payload)
		}
		if (statuses[i] == order.StatusCancelled) != (p.Data.Reason == "payment declined") {
			t.Errorf("payload %d reason: %s", i, d.Payload)
		}
	}
}

func TestApplyWithoutCallbackStoresNothing(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	o := newOrder(t, db.Pool, "")
	if created, err := handle(t, db.Pool, event(o, order.StatusProcessing, 0)); err != nil || created {
		t.Fatalf("created=%v err=%v", created, err)
	}
	checkNoDeliveries(t, db.Pool)
}

// TestApplyRefusesEventsWithoutAnOrderOrHistory: a payload that names an
// unknown order, another client's order, or a status the order never had
// is a permanent error, and nothing is stored.
func TestApplyRefusesEventsWithoutAnOrderOrHistory(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	o := newOrder(t, db.Pool, "https://shop.example/hooks")
	unknown := event(o, order.StatusProcessing, 0)
	unknown.OrderID = uuid.Must(uuid.NewV7())
	if _, err := handle(t, db.Pool, unknown); !errors.Is(err, orderstore.ErrNotFound) {
		t.Errorf("unknown order: %v", err)
	}
	other := event(o, order.StatusProcessing, 0)
	other.ClientID = uuid.New()
	if _, err := handle(t, db.Pool, other); !errors.Is(err, orderstore.ErrNotFound) {
		t.Errorf("another client's order: %v", err)
	}
	if _, err := handle(t, db.Pool, event(o, order.StatusPaid, 0)); !errors.Is(err, notify.ErrNoHistory) {
		t.Errorf("a status the order never had: %v", err)
	}
	checkNoDeliveries(t, db.Pool)
}

// TestApplyNotifiesChangesWhoseEventsWereLost: the broker lost the events
// of the first two changes (a stream deleted after the order moved on);
// the next event the notifier gets also stores the deliveries of the
// changes it never heard of, so the client learns of every status.
// Before, those changes never got a webhook.
func TestApplyNotifiesChangesWhoseEventsWereLost(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	o := cancelledOrder(t, db.Pool)
	if created, err := handle(t, db.Pool, event(o, order.StatusCancelled, 0)); err != nil || !created {
		t.Fatalf("cancelled: created=%v err=%v", created, err)
	}
	ds, err := webhook.List(t.Context(), db.Pool, o.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 3 {
		t.Fatalf("%d deliveries, want one per change (3)", len(ds))
	}
	for i, want := range []order.Status{order.StatusProcessing, order.StatusReserved, order.StatusCancelled} {
		var p struct {
			Data struct {
				Status order.Status `json:"status"`
				Seq    int          `json:"seq"`
			} `json:"data"`
		}
		if err := json.Unmarshal(ds[i].Payload, &p); err != nil || p.Data.Status != want || p.Data.Seq != i+1 {
			t.Errorf("delivery %d: %s, want %s", i, ds[i].Payload, want)
		}
	}
	// A late copy of a lost event finds its delivery there: nothing new.
	if created, err := handle(t, db.Pool, event(o, order.StatusProcessing, 0)); err != nil || created {
		t.Fatalf("late processing: created=%v err=%v", created, err)
	}
}
