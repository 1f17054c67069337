package producer_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"orderpipe/producer"
	"orderpipe/shared/app"
	"orderpipe/shared/config"
	"orderpipe/shared/outbox"
	"orderpipe/shared/tenant"
	"orderpipe/shared/tooling/testenv"
)

// TestStartsAndAcceptsWhileNATSIsDown: the producer starts with its NATS
// server down (before, app.Open refused), accepts orders durably into the
// outbox at once — concurrent requests, more than its pool has
// connections, none waiting on the broker — and the relay publishes them
// when the broker comes back, with the stream provisioned then.
func TestStartsAndAcceptsWhileNATSIsDown(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	ns := testenv.OwnNATS(t)
	ns.Stop()
	cfg := config.Config{DatabaseURL: db.URL, NATSURL: ns.URL(), StreamReplicas: 1, ShutdownTimeout: 5 * time.Second, LogLevel: "warn"}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	env, err := app.Open(ctx, cfg, testenv.Logger(t), "producer")
	if err != nil {
		t.Fatalf("the producer does not start while NATS is down: %v", err)
	}
	defer env.Close()
	creds, err := tenant.Create(ctx, env.Pool, "broker-down")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		done <- producer.Run(ctx, env, l, producer.Options{RateLimit: 1e6, RateBurst: 1e6, Timeout: 3 * time.Minute, InlinePublishTimeout: 2 * time.Minute})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("producer: %v", err)
		}
	}()
	url := "http://" + l.Addr().String()
	testenv.WaitFor(t, 10*time.Second, "the producer listening", func() bool {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})

	const n = 24
	var wg sync.WaitGroup
	codes := make([]int, n)
	took := make([]time.Duration, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"request_id":"down-%02d","user_id":1,"items":[{"sku":"SKU-1","quantity":1}],"amount":"1.00","currency":"CNY"}`, i)
			req, _ := http.NewRequest(http.MethodPost, url+"/v1/orders", bytes.NewReader([]byte(body)))
			req.Header.Set("Authorization", "Bearer "+creds.APIKey)
			req.Header.Set("Content-Type", "application/json")
			t0 := time.Now()
			resp, err := http.DefaultClient.Do(req)
			took[i] = time.Since(t0)
			if err != nil {
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	for i := range n {
		// The inline publish may wait 2 minutes for the broker and the
		// server's deadline is 3: an answer that waited on the broker at all
		// would take minutes, however busy the machine; one that did not
		// takes well under one.
		if codes[i] != http.StatusAccepted || took[i] > time.Minute {
			t.Errorf("order %d with NATS down: %d after %s, want 202 without waiting on the broker", i, codes[i], took[i].Round(time.Millisecond))
		}
	}
	if pending, err := outbox.Pending(ctx, env.Pool); err != nil || pending != n {
		t.Fatalf("%d events pending in the outbox (%v), want %d", pending, err, n)
	}

	ns.Start()
	testenv.WaitFor(t, 30*time.Second, "the relay publishing the outbox once NATS is back", func() bool {
		pending, err := outbox.Pending(ctx, env.Pool)
		return err == nil && pending == 0
	})
	if _, info := testenv.StreamInfo(t, env.JS, env.Topology.Stream); info.State.Msgs != n {
		t.Fatalf("stream: %v; want %d messages", info, n)
	}
}
