package main

import (
	"testing"

	"orderpipe/producer"
	"orderpipe/shared/orderevent"
	"orderpipe/shared/orderevent/contract"
	"orderpipe/shared/tooling/testenv"
)

// checkContract validates every message of the test's stream against the
// AsyncAPI document and every received webhook against the OpenAPI
// document's webhooks, so that a Go type that drifts from its schema fails
// the end-to-end test. orders is how many orders went through the pipeline
// to confirmed: each produced at least accepted, reserved, paid and
// confirmed, and four webhooks.
func checkContract(t *testing.T, n *testenv.NATSEnv, hooks []hook, orders int) {
	t.Helper()
	ev, err := contract.DefaultEvents()
	if err != nil {
		t.Fatal(err)
	}
	wh, err := contract.LoadWebhooks(producer.OpenAPI(), "orderStatusChanged")
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := ev.ValidateStream(t.Context(), n.JS, n.Topology)
	if err != nil {
		t.Error(err)
	}
	seen := map[orderevent.Name]int{}
	for _, m := range msgs {
		if m.Header.Get("traceparent") == "" {
			t.Errorf("stream sequence %d (%s): no traceparent although the change was traced", m.Sequence, m.Subject)
		}
		if e, err := orderevent.Decode(m.Data); err == nil {
			seen[e.Name]++
		}
	}
	for _, name := range []orderevent.Name{orderevent.Accepted, orderevent.Reserved, orderevent.Paid, orderevent.Confirmed} {
		if seen[name] < orders {
			t.Errorf("the stream holds %d %s events, want at least %d: %v", seen[name], name, orders, seen)
		}
	}
	for i, h := range hooks {
		if err := wh.Validate(h.header, h.raw); err != nil {
			t.Errorf("webhook %d (%s): %v\n%s", i, h.header.Get("webhook-id"), err, h.raw)
		}
	}
	if len(hooks) < orders*4 {
		t.Errorf("%d webhooks validated, want at least %d", len(hooks), orders*4)
	}
}
