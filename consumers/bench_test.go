package consumers_test

import (
	"fmt"
	"testing"
	"time"

	"orderpipe/consumers"
	"orderpipe/consumers/inventory"
	"orderpipe/consumers/pipetest"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
)

// benchSKUs is how many SKUs the benchmark's orders spread over (two
// distinct lines each), so that the workers seldom wait on one stock row.
const benchSKUs = 100

// BenchmarkStep measures the inventory step through the real router
// (pipetest.Start) over real NATS and PostgreSQL: b.N orders are stored
// and their accepted events published the way the intake does, then the
// router starts and the clock runs until every order has left processing.
// ns/op is wall time per message. dedupe is the production handler (the
// dedupe row in the step's transaction; the pre-check SELECT on
// processed_messages runs on redeliveries only, so not here); no-dedupe is
// the same handler without both
// (consumers.WithoutDedupe, a test-only switch), so the ratio of the two
// is the cost of dedupe:
//
//	go test -run '^$' -bench Step -benchtime 2000x -count 6 ./consumers/
//
// Every run (each b.N of each -count round) has a database and a stream
// of its own. Go runs the -count rounds of one sub-benchmark back to back
// (all dedupe rounds, then all no-dedupe rounds); for an A/B on a busy
// machine, alternate the two in separate runs:
//
//	go test -c -o consumers.test ./consumers/
//	for i in 1 2 3 4 5 6; do
//	  for v in dedupe no-dedupe; do ./consumers.test -test.run '^$' -test.bench "Step/^$v\$" -test.benchtime 2000x -test.benchmem; done
//	done
func BenchmarkStep(b *testing.B) {
	variants := []struct {
		name string
		cfg  consumers.Config
	}{
		{"dedupe", pipetest.Config()},
		{"no-dedupe", consumers.WithoutDedupe(pipetest.Config())},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := b.Context()
			e := pipetest.New(b, pspserver.Options{})
			e.Quiet(b)
			for i := range benchSKUs {
				e.Stock(b, fmt.Sprintf("SKU-%d", i), 1e9)
			}
			ids := make([]int64, b.N)
			for i := range ids {
				_, ids[i] = e.InsertOrder(b, "10.00",
					pipetest.Line{SKU: fmt.Sprintf("SKU-%d", i%benchSKUs), Qty: 1},
					pipetest.Line{SKU: fmt.Sprintf("SKU-%d", (i+1)%benchSKUs), Qty: 2})
			}
			relay := &outbox.Relay{Pool: e.DB.Pool, JS: e.App.JS, Topology: e.App.Topology, Logger: e.App.Logger}
			if err := relay.Publish(ctx, ids...); err != nil {
				b.Fatalf("publish accepted events: %v", err)
			}
			b.ReportAllocs()
			pipetest.Start(b, e.App, v.cfg, inventory.Step())
			b.ResetTimer()
			testenv.WaitFor(b, 5*time.Minute, "every order past the inventory step", func() bool {
				var open int
				err := e.DB.Pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'processing'`).Scan(&open)
				return err == nil && open == 0
			})
			b.StopTimer()
			var reserved, total, dedupeRows int
			if err := e.DB.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'reserved'), count(*), (SELECT count(*) FROM processed_messages) FROM orders`).
				Scan(&reserved, &total, &dedupeRows); err != nil {
				b.Fatal(err)
			}
			if reserved != total {
				b.Fatalf("%d of %d orders reserved, want all", reserved, total)
			}
			want := total // one dedupe row per message
			if v.name == "no-dedupe" {
				want = 0
			}
			if dedupeRows != want {
				b.Fatalf("%s: %d dedupe rows for %d orders, want %d", v.name, dedupeRows, total, want)
			}
		})
	}
}
