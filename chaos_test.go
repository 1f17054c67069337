package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/shared/order"
	"orderpipe/shared/tooling/chaos"
	"orderpipe/shared/tooling/testenv"
)

// TestChaosCommandsRefuseBadInput: every malformed flag value of chaos,
// check and natsnode is a usage error (exit 2) that names the problem.
func TestChaosCommandsRefuseBadInput(t *testing.T) {
	cleanEnv(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"chaos", "--time", "0s"}, "--time"},
		{[]string{"chaos", "--time", "48h"}, "--time"},
		// --clients 0 after a value that must be refused first: a build
		// that let the value through stops there instead of running chaos.
		{[]string{"chaos", "--time", "500ms", "--clients", "0"}, "--time must be between 1s and 24h, got 500ms"},
		{[]string{"chaos", "--time", "1ns", "--clients", "0"}, "--time must be between 1s and 24h, got 1ns"},
		{[]string{"chaos", "--seed", "0", "--clients", "0"}, "--seed must be a positive integer"},
		{[]string{"chaos", "--clients", "0"}, "--clients"},
		{[]string{"chaos", "--quiesce", "-1s"}, "--quiesce"},
		{[]string{"chaos", "extra"}, "no arguments"},
		{[]string{"check", "--initial-stock", "SKU-1"}, "SKU=N"},
		{[]string{"check", "--initial-stock", "SKU-1=-3"}, "SKU=N"},
		{[]string{"check", "--initial-stock", "=5"}, "SKU=N"},
		{[]string{"check", "--initial-stock", "SKU-1 =5"}, "SKU=N"},
		{[]string{"check", "--initial-stock", "SKU:1=5"}, "SKU=N"},
		{[]string{"check", "extra"}, "no arguments"},
		{[]string{"natsnode"}, "--store"},
		{[]string{"natsnode", "--store", "x", "--port", "70000"}, "ports"},
		{[]string{"natsnode", "--store", "x", "--routes", "nats://127.0.0.1:1"}, "--cluster-port"},
	} {
		code, _, errOut := orderpipe(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("orderpipe %v: exit %d, stderr %q; want 2 naming %q", tc.args, code, errOut, tc.want)
		}
	}
	for _, v := range []string{"minus-one", "-1", "0", "18446744073709551616"} {
		t.Setenv("CHAOS_SEED", v)
		if code, _, errOut := orderpipe(t, "chaos", "--clients", "0"); code != 2 || !strings.Contains(errOut, "CHAOS_SEED must be a positive integer") || !strings.Contains(errOut, `"`+v+`"`) {
			t.Errorf("CHAOS_SEED=%s: exit %d, stderr %q", v, code, errOut)
		}
	}
	t.Setenv("CHAOS_SEED", "")
	for _, v := range []string{"soon", "-5s", "500ms", "25h"} {
		t.Setenv("CHAOS_TIME", v)
		if code, _, errOut := orderpipe(t, "chaos", "--clients", "0"); code != 2 || !strings.Contains(errOut, "CHAOS_TIME") || !strings.Contains(errOut, `"`+v+`"`) || strings.Contains(errOut, "--time must") {
			t.Errorf("CHAOS_TIME=%s: exit %d, stderr %q; want 2 naming CHAOS_TIME and the value", v, code, errOut)
		}
	}
}

// TestCheckFindsBrokenInvariants plants one violation of each kind in a
// real database and expects the checker to name exactly those orders, and
// a clean database to pass.
func TestCheckFindsBrokenInvariants(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ctx := t.Context()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	rep, err := chaos.Check(ctx, db.Pool, chaos.CheckOptions{})
	if err != nil || !rep.OK() {
		t.Fatalf("empty database: %+v, %v", rep, err)
	}
	client := uuid.New()
	exec(`INSERT INTO api_clients (client_id, name, api_key_hash, webhook_secret) VALUES ($1, 'c', $2, 'whsec_x')`, client, client[:])
	newOrder := func(status string) uuid.UUID {
		id := uuid.Must(uuid.NewV7())
		exec(`INSERT INTO orders (order_id, order_no, client_id, request_id, fingerprint, status, user_id, items, amount, currency)
			VALUES ($1, $2, $3, $4, '\x00', $5, 1, '[]', 1.00, 'CNY')`, id, order.NewOrderNo(time.Now()), client, "r"+id.String()[:8]+id.String()[24:], status)
		return id
	}
	open := newOrder("reserved")
	unpaid := newOrder("confirmed") // confirmed without a charge
	refundless := newOrder("cancelled")
	exec(`INSERT INTO psp_charges (idempotency_key, fingerprint, state, charge_id, amount, currency, reference) VALUES ('k', '\x00', 'succeeded', 'ch_1', 1.00, 'CNY', $1)`, refundless.String())
	exec(`INSERT INTO inventory (sku, available) VALUES ('SKU-9', 7)`)
	sent := map[string]bool{}
	for _, id := range []uuid.UUID{open, unpaid} { // refundless's was never sent
		sent["r"+id.String()[:8]+id.String()[24:]] = true
	}
	rep, err = chaos.Check(ctx, db.Pool, chaos.CheckOptions{InitialStock: map[string]int64{"SKU-9": 10}, Accepted: map[string]string{"lost-request": uuid.NewString()}, Sent: sent})
	if err != nil {
		t.Fatal(err)
	}
	broken := map[string]int{}
	for _, inv := range rep.Invariants {
		broken[inv.Name] = len(inv.Broken)
	}
	for name, want := range map[string]int{
		"every order is terminal":                                       1,
		"confirmed ⇔ exactly one succeeded charge and no refund":        2,
		"cancelled after a charge: one refund; before any: none":        1,
		"stock conserved: available + held = initial":                   1,
		"each accepted request_id is exactly its one order":             1,
		"every order was asked for by a client":                         1,
		"every dead letter explained (replayed, or its order terminal)": 0,
	} {
		if broken[name] != want {
			t.Errorf("%s: %d broken, want %d (%+v)", name, broken[name], want, rep.Invariants)
		}
	}
	got := strings.Join(rep.BrokenOrders(), " ")
	for _, id := range []uuid.UUID{open, unpaid, refundless} {
		if !strings.Contains(got, id.String()) {
			t.Errorf("broken orders %s lack %s", got, id)
		}
	}
	if rep.OK() {
		t.Fatal("the report says every invariant held")
	}
}
