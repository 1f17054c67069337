package tracing

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestContextSurvivesTheCarrier(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() { _ = tp.Shutdown(t.Context()) }()
	Install(tp)
	ctx, span := Tracer().Start(t.Context(), "intake")
	md := map[string]string{}
	Inject(ctx, md)
	span.End()
	if md[Header] == "" {
		t.Fatalf("no %s in %v", Header, md)
	}
	rctx := Extract(t.Context(), md)
	_, child := Tracer().Start(rctx, "handler")
	child.End()
	spans := exp.GetSpans()
	if len(spans) != 2 || spans[0].SpanContext.TraceID() != spans[1].SpanContext.TraceID() {
		t.Fatalf("spans do not share a trace: %v", spans)
	}
	if TraceID(rctx) != spans[0].SpanContext.TraceID().String() {
		t.Fatal("TraceID of the extracted context differs")
	}
	var buf bytes.Buffer
	slog.New(LogHandler(slog.NewJSONHandler(&buf, nil))).InfoContext(ctx, "x")
	if !strings.Contains(buf.String(), `"trace_id":"`+TraceID(ctx)+`"`) {
		t.Fatalf("log line lacks trace_id: %s", buf.String())
	}
}

func TestExtractMalformed(t *testing.T) {
	for _, v := range []string{"", "garbage", "00-zz-yy-01", "00-00000000000000000000000000000000-0000000000000000-01"} {
		ctx := Extract(t.Context(), map[string]string{Header: v})
		if TraceID(ctx) != "" {
			t.Errorf("traceparent %q gave a trace id", v)
		}
	}
}

// TestTraceIDsSurviveShutdown: a process that set tracing up and shut it
// down (one part of `dev`, a test's env) still gets trace ids afterwards.
func TestTraceIDsSurviveShutdown(t *testing.T) {
	shutdown, err := Setup(t.Context(), "test", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, span := Tracer().Start(t.Context(), "after")
	defer span.End()
	if TraceID(ctx) == "" {
		t.Fatal("no trace id after the exporter's shutdown")
	}
}

// TestExportsToEndpoint: with an endpoint, the spans a process makes reach
// the collector's traces path under it when tracing shuts down.
func TestExportsToEndpoint(t *testing.T) {
	got := make(chan string, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Method + " " + r.URL.Path
		w.WriteHeader(http.StatusOK)
	}))
	defer collector.Close()
	shutdown, err := Setup(t.Context(), "test", collector.URL+"/")
	if err != nil {
		t.Fatal(err)
	}
	_, span := Tracer().Start(t.Context(), "exported")
	span.End()
	if err := shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case req := <-got:
		if req != "POST /v1/traces" {
			t.Fatalf("collector got %q, want POST /v1/traces", req)
		}
	default:
		t.Fatal("the collector got no export by the time shutdown returned")
	}
}
