package producer_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"orderpipe/producer"
	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// BenchmarkCreateOrder measures POST /v1/orders through the whole intake —
// HTTP, authentication, decoding, the insert transaction with its history
// and outbox rows, and the inline publish to JetStream — against the real
// servers, for a new order and for a replay of one, side by side:
//
//	go test -run '^$' -bench CreateOrder -benchmem -count 6 ./producer/
//
// new-64-clients sends new orders from 64 concurrent clients; its ns/op is
// wall time per order across them (the inverse of the throughput).
func BenchmarkCreateOrder(b *testing.B) {
	db, n := testenv.DB(b), testenv.NATS(b)
	env := testenv.Env(b, db, n)
	env.Logger = app.NewLogger(config.Config{LogFormat: "json", LogLevel: "error"}, io.Discard)
	srv := httptest.NewServer(producer.Handler(env, producer.Options{RateLimit: 1e9, RateBurst: 1e9, MaxInFlight: 1024}))
	b.Cleanup(srv.Close)
	creds, err := tenant.Create(b.Context(), db.Pool, "bench")
	if err != nil {
		b.Fatal(err)
	}
	post := func(b *testing.B, rid string, want int) {
		body := fmt.Sprintf(`{"request_id":%q,"user_id":1,"items":[{"sku":"SKU-1","quantity":2}],"amount":"39.98","currency":"CNY"}`, rid)
		req, _ := http.NewRequest("POST", srv.URL+"/v1/orders", bytes.NewBufferString(body))
		req.Header.Set("Authorization", "Bearer "+creds.APIKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := srv.Client().Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			b.Fatalf("request %s: %d, want %d", rid, resp.StatusCode, want)
		}
	}
	run := 0
	b.Run("new", func(b *testing.B) {
		run++
		for i := 0; b.Loop(); i++ {
			post(b, fmt.Sprintf("bench-%d-%d", run, i), http.StatusAccepted)
		}
	})
	// 64 clients at once (32 per core on this 2-core machine), as a busy
	// backend brings them: the group commit shares one transaction among
	// the requests that wait together.
	var seq atomic.Int64
	b.Run("new-64-clients", func(b *testing.B) {
		run++
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				post(b, fmt.Sprintf("bench-par-%d-%d", run, seq.Add(1)), http.StatusAccepted)
			}
		})
	})
	post(b, "bench-replay", http.StatusAccepted)
	b.Run("replay", func(b *testing.B) {
		for b.Loop() {
			post(b, "bench-replay", http.StatusOK)
		}
	})
}
