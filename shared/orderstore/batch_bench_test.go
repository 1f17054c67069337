package orderstore_test

import (
	"fmt"
	"testing"

	"orderpipe/shared/orderstore"
	"orderpipe/shared/tooling/testenv"
)

// BenchmarkInsertBatch measures orderstore.InsertBatch, the intake's group
// commit, on the real PostgreSQL of testenv, for batches of 1, 16 and 64
// new orders. ns/op, B/op and allocs/op are per order: a batch of 64 counts
// 64 ops (the last batch of a run may be smaller):
//
//	go test -run '^$' -bench InsertBatch -benchmem -count 6 ./shared/orderstore/
func BenchmarkInsertBatch(b *testing.B) {
	db := testenv.DB(b)
	client := newClient(b, db.Pool)
	run := 0
	for _, size := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("batch-%d", size), func(b *testing.B) {
			ctx := b.Context()
			run++
			// b.N orders with request ids of their own (every one new),
			// built before the clock starts.
			reqs := make([]orderstore.NewOrder, b.N)
			for i := range reqs {
				reqs[i] = orderstore.NewOrder{Ctx: ctx, ClientID: client, Req: request(b, fmt.Sprintf("bench-%d-%d", run, i), `"39.98"`)}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += size {
				res, err := orderstore.InsertBatch(ctx, db.Pool, reqs[i:min(i+size, b.N)], nil)
				if err != nil {
					b.Fatal(err)
				}
				for _, r := range res {
					if r.Err != nil || r.Replayed || r.Retry || r.OutboxID == 0 {
						b.Fatalf("not a new order: %+v", r)
					}
				}
			}
		})
	}
}
