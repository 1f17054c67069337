package payment_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"orderpipe/consumers"
	"orderpipe/consumers/confirm"
	"orderpipe/consumers/payment"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderstore"
	"orderpipe/shared/outbox"
	"orderpipe/shared/payments"
	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
)

// reservedOrders stores n orders already reserved (stock taken, the
// reserved event in the outbox, as the stock step leaves them) without
// publishing anything: the test decides what lands in the stream, and in
// which order.
func reservedOrders(t *testing.T, e *pipetest.Env, n int) (ids []uuid.UUID, reserved []int64) {
	t.Helper()
	for range n {
		id, _ := e.InsertOrder(t, "5.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
		err := pgx.BeginFunc(t.Context(), e.DB.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(t.Context(), `UPDATE inventory SET available = available - 1 WHERE sku = 'SKU-1'`); err != nil {
				return err
			}
			if _, err := tx.Exec(t.Context(), `INSERT INTO reservations (order_id, sku, quantity) VALUES ($1, 'SKU-1', 1)`, id); err != nil {
				return err
			}
			moved, err := orderstore.Transition(t.Context(), tx, id, order.StatusProcessing, order.StatusReserved, "")
			if err == nil && !moved.OK {
				err = fmt.Errorf("order %s is %s", id, moved.Current)
			}
			reserved = append(reserved, moved.Event.ID)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids, reserved
}

func relayOf(e *pipetest.Env) *outbox.Relay {
	return &outbox.Relay{Pool: e.DB.Pool, JS: e.App.JS, Topology: e.App.Topology, Logger: e.App.Logger}
}

// prechargedOrders is the set-up of a race between two deliveries that
// charge: a pipeline on a default provider and n reserved orders (see
// reservedOrders), with the provider's answer for each order's charge key
// made final before the payment step runs, so that every delivery that
// charges gets the same succeeded answer at once (the interleaving the
// race needs).
func prechargedOrders(t *testing.T, n int) (e *pipetest.Env, client *psp.Client, ids []uuid.UUID, reserved []int64) {
	t.Helper()
	e, client = setup(t, pspserver.Options{})
	ids, reserved = reservedOrders(t, e, n)
	for _, id := range ids {
		if _, err := client.Charge(t.Context(), payments.ChargeKey(id), "5.00", "CNY", id.String()); err != nil {
			t.Fatal(err)
		}
	}
	return e, client, ids, reserved
}

// publishEvent writes e to the outbox and publishes it at once, as the
// compensator's re-drive does.
func publishEvent(t *testing.T, env *pipetest.Env, e orderevent.Event) {
	t.Helper()
	var oid int64
	err := pgx.BeginFunc(t.Context(), env.DB.Pool, func(tx pgx.Tx) error {
		var err error
		oid, err = outbox.Enqueue(t.Context(), tx, e)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	publishOutbox(t, env, oid)
}

func reservedEvent(e *pipetest.Env, id uuid.UUID, redrive int) orderevent.Event {
	return orderevent.Event{Version: orderevent.Version, Name: orderevent.Reserved, OrderID: id, ClientID: e.ClientID,
		RequestID: "race-" + id.String(), Status: order.StatusReserved, OccurredAt: time.Now().UTC(), Redrive: redrive}
}

// publishOutbox publishes the outbox row oid (an order's original event).
func publishOutbox(t *testing.T, e *pipetest.Env, oid int64) {
	t.Helper()
	if err := relayOf(e).Publish(t.Context(), oid); err != nil {
		t.Fatal(err)
	}
}

// payAndConfirm runs the payment and confirm steps until every order is
// terminal, and checks that none was refunded.
func payAndConfirm(t *testing.T, e *pipetest.Env, client *psp.Client, ids []uuid.UUID) {
	t.Helper()
	pipetest.Start(t, e.App, pipetest.Config(), payment.Step(e.DB.Pool, client), confirm.Step())
	e.WaitTerminal(t, 60*time.Second)
	checkNoRefund(t, e, ids)
}

// checkNoRefund fails the test if the provider holds any refund: every
// order here ends confirmed, so a refund is a paid order given back.
func checkNoRefund(t *testing.T, e *pipetest.Env, ids []uuid.UUID) {
	t.Helper()
	for _, id := range ids {
		if s := e.Status(t, id); s != order.StatusConfirmed {
			t.Errorf("order %s: %s, want confirmed", id, s)
		}
	}
	if n := count(t, e, `SELECT count(*) FROM psp_refunds`); n != 0 {
		t.Errorf("%d of %d confirmed orders refunded at the provider", n, len(ids))
	}
	if n := count(t, e, `SELECT count(*) FROM payments WHERE status <> 'succeeded'`); n != 0 {
		t.Errorf("%d payments not succeeded", n)
	}
	e.CheckInvariants(t)
}

// TestRedriveRacesOriginal: the compensator's re-drive of reserved lies
// right behind the original in the stream; with 8 workers both are handled
// at once, both charge (the provider answers the same success), one moves
// the order to paid, and the other must then do nothing. On the code before
// this test, most such orders ended confirmed with their charge refunded.
func TestRedriveRacesOriginal(t *testing.T) {
	t.Parallel()
	e, client, ids, reserved := prechargedOrders(t, 30)
	for i, id := range ids {
		publishOutbox(t, e, reserved[i])
		publishEvent(t, e, reservedEvent(e, id, 1))
	}
	payAndConfirm(t, e, client, ids)
}

// TestRedeliveryWhileSlowHandlerHolds: the same reserved event is delivered
// again (republished with a new Nats-Msg-Id, as a redelivery would) while
// the first delivery is still waiting on a slow provider; the second waits
// on 409 (in flight) and must not undo what the first committed.
func TestRedeliveryWhileSlowHandlerHolds(t *testing.T) {
	t.Parallel()
	e, client := setup(t, pspserver.Options{Latency: 300 * time.Millisecond})
	ids, reserved := reservedOrders(t, e, 10)
	for i, id := range ids {
		publishOutbox(t, e, reserved[i])
		ev := reservedEvent(e, id, 0)
		publishRaw(t, e, ev, ev.MsgID()+":again")
	}
	payAndConfirm(t, e, client, ids)
	if n := count(t, e, `SELECT count(*) FROM psp_charges`); n != len(ids) {
		t.Fatalf("%d charges for %d orders", n, len(ids))
	}
}

// TestDeadLetterReplayRacesRedrive: an operator replays the payment step's
// dead letter of reserved while the compensator's re-drive of the same
// order arrives; the two carry different dedupe ids, both charge, and the
// order must still end confirmed with no refund.
func TestDeadLetterReplayRacesRedrive(t *testing.T) {
	t.Parallel()
	e, client, ids, _ := prechargedOrders(t, 20)
	for _, id := range ids {
		ev := reservedEvent(e, id, 0)
		payload, err := orderevent.Encode(ev)
		if err != nil {
			t.Fatal(err)
		}
		var dl int64
		if err := e.DB.Pool.QueryRow(t.Context(), `
			INSERT INTO dead_letters (consumer, message_id, subject, order_id, payload, headers, error, attempts)
			VALUES ('payment', $1, $2, $3, $4, '{}', 'test: provider down', 20) RETURNING id`,
			ev.MsgID(), e.App.Topology.Subject(orderevent.Reserved), id, payload).Scan(&dl); err != nil {
			t.Fatal(err)
		}
		if _, err := consumers.ReplayDeadLetter(t.Context(), e.DB.Pool, e.App.JS, dl); err != nil {
			t.Fatal(err)
		}
		publishEvent(t, e, reservedEvent(e, id, 1))
	}
	payAndConfirm(t, e, client, ids)
}

// publishRaw publishes ev under the given Nats-Msg-Id.
func publishRaw(t *testing.T, e *pipetest.Env, ev orderevent.Event, msgID string) {
	t.Helper()
	payload, err := orderevent.Encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	h := ev.Headers()
	h[orderevent.HeaderMsgID] = msgID
	msg := &nats.Msg{Subject: e.App.Topology.Subject(ev.Name), Data: payload, Header: nats.Header{}}
	for k, v := range h {
		msg.Header.Set(k, v)
	}
	if _, err := e.App.JS.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(fmt.Errorf("publish %s: %w", msgID, err))
	}
}
