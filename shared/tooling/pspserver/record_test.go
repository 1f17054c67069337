package pspserver_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"orderpipe/shared/psp"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// standIn is a stand-in without latency or failures on the test's own
// database.
func standIn(t *testing.T) (*testenv.Database, *pspserver.Server) {
	t.Helper()
	db := testenv.DB(t)
	srv, err := pspserver.NewServer(db.Pool, pspserver.Options{}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	return db, srv
}

// TestConcurrentChargesShareACommit: charges that arrive while the
// stand-in records another go together in its next statement, one
// transaction for all of them, and each gets its own answer; two charges
// of one key in a batch are one charge, the second answered as a repeat.
// The first charge is held by a row the test writes under the same key
// and does not commit, so that the others queue behind it.
func TestConcurrentChargesShareACommit(t *testing.T) {
	t.Parallel()
	db, srv := standIn(t)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	c := psp.NewClient(hs.URL, 30*time.Second)
	ctx := t.Context()

	hold, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := hold.Exec(ctx, `INSERT INTO psp_charges (idempotency_key, fingerprint, state, charge_id, amount, currency, reference)
		VALUES ('k-share-0', 'x', 'in_flight', 'ch_held', 3.00, 'CNY', 'r')`); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		key string
		a   psp.Answer
		err error
	}
	answers := make(chan answer, 32)
	var wg sync.WaitGroup
	charge := func(key string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := c.Charge(ctx, key, "3.00", "CNY", "r")
			answers <- answer{key, a, err}
		}()
	}
	charge("k-share-0")
	testenv.WaitFor(t, 10*time.Second, "the first charge's statement waiting for the held key", func() bool {
		var n int
		_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%INSERT INTO psp_charges%'`).Scan(&n)
		return n == 1
	})
	const others = 20
	for i := 1; i <= others; i++ {
		charge(fmt.Sprintf("k-share-%d", i))
	}
	charge("k-share-1") // the same key again, in the same batch
	testenv.WaitFor(t, 10*time.Second, "the other charges queued", func() bool { return srv.QueuedCharges() == others+1 })
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(answers)
	ids := map[string]string{}
	for a := range answers {
		if a.err != nil || a.a.Status != psp.StatusSucceeded {
			t.Fatalf("charge %s: %+v, %v", a.key, a.a, a.err)
		}
		if id, seen := ids[a.key]; seen && id != a.a.ID {
			t.Fatalf("charge %s answered twice with two charges: %s and %s", a.key, id, a.a.ID)
		}
		ids[a.key] = a.a.ID
	}
	var rows, txs int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM psp_charges
		WHERE idempotency_key LIKE 'k-share-%' AND idempotency_key <> 'k-share-0'`).Scan(&rows, &txs); err != nil {
		t.Fatal(err)
	}
	if rows != others || txs != 1 {
		t.Fatalf("%d charges queued behind a running one were recorded as %d rows in %d transactions; want %d rows in 1", others, rows, txs, others)
	}
}

// TestAFailedBatchRecordsEachChargeAlone: a batch whose statement fails
// (one key the table refuses) is recorded charge by charge, so that the
// error is the bad charge's only.
func TestAFailedBatchRecordsEachChargeAlone(t *testing.T) {
	t.Parallel()
	db, srv := standIn(t)
	bad := strings.Repeat("k", 300) // the table's CHECK: at most 255
	inserted, errs := pspserver.RecordBatch(srv, "k-alone-1", bad, "k-alone-2", "k-alone-1")
	want := []bool{true, false, true, false}
	for i := range want {
		if inserted[i] != want[i] || (errs[i] != nil) != (i == 1) {
			t.Fatalf("charge %d: inserted %v, error %v; want inserted %v, an error only for the bad key", i, inserted[i], errs[i], want[i])
		}
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM psp_charges WHERE idempotency_key LIKE 'k-alone-%'`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows (%v), want 2", n, err)
	}
}
