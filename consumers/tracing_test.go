package consumers_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"orderpipe/consumers/pipetest"
	"orderpipe/shared/tooling/pspserver"
	"orderpipe/shared/tooling/testenv"
	"orderpipe/shared/tracing"
)

// TestStepSpansShareTheOrdersTrace: each step runs in a consumer span, and
// the event it writes carries that span's trace to the next step. Not
// parallel: it installs the process's tracer provider.
func TestStepSpansShareTheOrdersTrace(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) }) // t.Context() is done in a cleanup
	tracing.Install(tp)
	e := pipetest.New(t, pspserver.Options{})
	e.Stock(t, "SKU-1", 10)
	pipetest.Start(t, e.App, pipetest.Config(), e.Steps(5*time.Second)...)
	e.CreateOrder(t, "1.00", pipetest.Line{SKU: "SKU-1", Qty: 1})
	e.WaitTerminal(t, 30*time.Second)
	// A step's span ends after its commit (and ack), so the last one may
	// still be open when the order is already terminal.
	traces := map[string]string{}
	testenv.WaitFor(t, 10*time.Second, "the confirm step's span to end", func() bool {
		for _, s := range exp.GetSpans() {
			traces[s.Name] = s.SpanContext.TraceID().String()
		}
		return traces["step confirm"] != ""
	})
	for _, name := range []string{"step inventory", "step payment", "step confirm"} {
		if traces[name] == "" {
			t.Fatalf("no span %q among %v", name, traces)
		}
		if traces[name] != traces["step inventory"] {
			t.Errorf("span %q is in trace %s, the inventory step in %s", name, traces[name], traces["step inventory"])
		}
	}
}
