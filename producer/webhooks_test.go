package producer_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"orderpipe/consumers/notify"
	"orderpipe/consumers/webhook"
	"orderpipe/producer"
	"orderpipe/shared/order"
	"orderpipe/shared/orderevent/contract"
)

func webhooks(t *testing.T) *contract.Webhooks {
	t.Helper()
	w, err := contract.LoadWebhooks(producer.OpenAPI(), "orderStatusChanged")
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// signedWebhook builds a callback the way the notifier and the delivery
// worker do: the Go types marshalled, signed with a client secret.
func signedWebhook(t *testing.T, reason string) (http.Header, []byte) {
	t.Helper()
	now := time.Now().UTC()
	ch := notify.StatusChange{Order: order.Order{ID: uuid.Must(uuid.NewV7()), No: order.NewOrderNo(now), RequestID: order.NewRequestID(now),
		Status: order.StatusCancelled, UserID: 42, Items: []order.Item{{SKU: "SKU-1", Quantity: 2}}, Amount: order.AmountFromCents(3998),
		Currency: "CNY", CreatedAt: now, UpdatedAt: now, Reason: reason, ClientID: uuid.New(), CallbackURL: "https://example.com/hooks"},
		Seq: 3, OccurredAt: now}
	data, err := json.Marshal(ch)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(webhook.Payload{Type: webhook.EventType, Timestamp: now, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	s, err := webhook.NewSigner("whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef")))
	if err != nil {
		t.Fatal(err)
	}
	id := webhook.ID(ch.ID, ch.Seq)
	sig, err := s.Sign(id, now, body)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set(webhook.HeaderID, id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	h.Set(webhook.HeaderSignature, sig)
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	return h, body
}

// The webhooks section documents the body the notifier builds and the
// Standard Webhooks headers the worker sets.
func TestOpenAPIDocumentsTheWebhook(t *testing.T) {
	t.Parallel()
	w := webhooks(t)
	for _, want := range []string{webhook.HeaderID, webhook.HeaderTimestamp, webhook.HeaderSignature, "traceparent"} {
		found := false
		for _, h := range w.Headers() {
			found = found || strings.EqualFold(h, want)
		}
		if !found {
			t.Errorf("header %s is not documented", want)
		}
	}
	for _, reason := range []string{"", "out of stock"} {
		h, body := signedWebhook(t, reason)
		if err := w.Validate(h, body); err != nil {
			t.Errorf("reason %q: %v\n%s", reason, err, body)
		}
	}
}

// A body or header that drifts from the document is refused.
func TestWebhookDriftIsRejected(t *testing.T) {
	t.Parallel()
	w := webhooks(t)
	h, body := signedWebhook(t, "")
	mutate := func(f func(m, data map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatal(err)
		}
		f(m, m["data"].(map[string]any))
		b, _ := json.Marshal(m)
		return b
	}
	for what, b := range map[string][]byte{
		"data.seq missing":        mutate(func(_, d map[string]any) { delete(d, "seq") }),
		"data.order_id missing":   mutate(func(_, d map[string]any) { delete(d, "order_id") }),
		"data.seq a string":       mutate(func(_, d map[string]any) { d["seq"] = "3" }),
		"data.amount a number":    mutate(func(_, d map[string]any) { d["amount"] = 39.98 }),
		"a new field in data":     mutate(func(_, d map[string]any) { d["client_id"] = uuid.NewString() }),
		"a new field in the body": mutate(func(m, _ map[string]any) { m["attempt"] = 1 }),
		"another type":            mutate(func(m, _ map[string]any) { m["type"] = "order.created" }),
		"timestamp not a time":    mutate(func(m, _ map[string]any) { m["timestamp"] = "now" }),
		"an item field":           mutate(func(_, d map[string]any) { d["items"].([]any)[0].(map[string]any)["price"] = "1.00" }),
	} {
		if err := w.Validate(h, b); !errors.Is(err, contract.ErrViolation) {
			t.Errorf("%s: %v, want a violation", what, err)
		}
	}
	for what, f := range map[string]func(h http.Header){
		"no webhook-id":         func(h http.Header) { h.Del(webhook.HeaderID) },
		"no webhook-signature":  func(h http.Header) { h.Del(webhook.HeaderSignature) },
		"a bad webhook-id":      func(h http.Header) { h.Set(webhook.HeaderID, "evt_1") },
		"a timestamp in ms":     func(h http.Header) { h.Set(webhook.HeaderTimestamp, "2026-12-02T14:30:22Z") },
		"a v2 signature":        func(h http.Header) { h.Set(webhook.HeaderSignature, "v2,abc") },
		"two webhook-id values": func(h http.Header) { h.Add(webhook.HeaderID, h.Get(webhook.HeaderID)) },
	} {
		hh := h.Clone()
		f(hh)
		if err := w.Validate(hh, body); !errors.Is(err, contract.ErrViolation) {
			t.Errorf("%s: %v, want a violation", what, err)
		}
	}
	if _, err := contract.LoadWebhooks(producer.OpenAPI(), "orderCreated"); err == nil {
		t.Error("an undocumented webhook was loaded")
	}
}
