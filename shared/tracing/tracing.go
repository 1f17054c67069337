// Package tracing carries one W3C trace context from the HTTP request that
// created an order through the outbox, the NATS message headers and every
// handler, out into the webhook request. There is one carrier — a
// map[string]string of message metadata, with the W3C header name
// "traceparent" (and "tracestate") — used for outbox rows, NATS headers and
// Watermill metadata alike.
//
// Spans are always created, so trace ids exist and appear in the logs; they
// are exported over OTLP/HTTP only when OTEL_EXPORTER_OTLP_ENDPOINT is set.
package tracing

import (
	"context"
	"log/slog"
	"strings"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkresource "go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Header is the one header name that carries the trace context.
const Header = "traceparent"

var propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

var setupOnce sync.Once

// A process that never calls Setup (a one-shot command, a test) still gets
// real, unexported spans, so trace ids exist wherever the package says so.
func init() { Install(sdktrace.NewTracerProvider()) }

// Setup installs the process's tracer provider and the W3C propagator. The
// returned function flushes and stops the exporter. endpoint is the OTLP/HTTP
// base URL to export to (config.Config.OTLPEndpoint); "" exports nothing.
func Setup(ctx context.Context, service, endpoint string) (shutdown func(context.Context) error, err error) {
	var opts []sdktrace.TracerProviderOption
	opts = append(opts, sdktrace.WithResource(sdkresource.NewSchemaless(semconv.ServiceName(service))))
	if endpoint != "" {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(tracesURL(endpoint)))
		if err != nil {
			return nil, err
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	Install(tp)
	return func(ctx context.Context) error {
		// Never leave a stopped provider installed: its spans would have no
		// trace ids for whatever still runs in this process (tests, dev).
		if otel.GetTracerProvider() == trace.TracerProvider(tp) {
			Install(sdktrace.NewTracerProvider())
		}
		return tp.Shutdown(ctx)
	}, nil
}

// Install makes tp the global tracer provider (tests install one with an
// in-memory exporter) and sets the propagator.
func Install(tp trace.TracerProvider) {
	otel.SetTracerProvider(tp)
	setupOnce.Do(func() { otel.SetTextMapPropagator(propagator) })
}

// Tracer returns orderpipe's tracer.
func Tracer() trace.Tracer { return otel.Tracer("orderpipe") }

// Inject writes ctx's trace context into md (traceparent, tracestate).
func Inject(ctx context.Context, md map[string]string) {
	propagator.Inject(ctx, propagation.MapCarrier(md))
}

// Extract returns ctx with the remote trace context found in md.
func Extract(ctx context.Context, md map[string]string) context.Context {
	return propagator.Extract(ctx, propagation.MapCarrier(md))
}

// TraceID returns the trace id of ctx's span, or "".
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// LogHandler wraps h so that every record logged with a context that
// carries a span gets trace_id and span_id attributes.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (l logHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return l.Handler.Handle(ctx, r)
}

func (l logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{l.Handler.WithAttrs(as)}
}
func (l logHandler) WithGroup(n string) slog.Handler { return logHandler{l.Handler.WithGroup(n)} }

// tracesURL is the traces URL under an OTLP/HTTP base endpoint, as the
// OpenTelemetry specification defines it for OTEL_EXPORTER_OTLP_ENDPOINT:
// the base with /v1/traces appended.
func tracesURL(endpoint string) string {
	return strings.TrimRight(endpoint, "/") + "/v1/traces"
}
