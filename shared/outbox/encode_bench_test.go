package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"orderpipe/shared/order"
	"orderpipe/shared/orderevent"
)

// BenchmarkEncodeBatch measures what the process spends on a group
// commit's events before and after the database: their rows (payload,
// headers, trace context), the statement's column arrays, and the broker
// messages of the inline publish, for a batch of 32 accepted orders with
// a sampled trace:
//
//	go test -run '^$' -bench EncodeBatch -benchmem -count 6 ./shared/outbox/
func BenchmarkEncodeBatch(b *testing.B) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	at := time.Now().UTC()
	entries := make([]Entry, 32)
	for i := range entries {
		entries[i] = Entry{Ctx: ctx, Event: orderevent.Event{Version: orderevent.Version, Name: orderevent.Accepted, OrderID: uuid.Must(uuid.NewV7()),
			ClientID: uuid.Must(uuid.NewV7()), RequestID: "ORD20261207062356397ea1d9", Status: order.StatusProcessing, OccurredAt: at}}
	}
	r := &Relay{Topology: orderevent.DefaultTopology}
	for b.Loop() {
		rows, err := Rows(ctx, entries)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Columns(rows); err != nil {
			b.Fatal(err)
		}
		for _, x := range rows {
			_ = r.message(x)
		}
	}
}
