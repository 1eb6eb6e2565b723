// Package tracing exports each ended hedge group as an OpenTelemetry trace
// (docs/architecture.md §9, "Traces"): a span for the group, from its
// submission to its last attempt's end, and a child span per attempt, with
// attributes of the OpenTelemetry GenAI semantic conventions where they fit
// and hedgerow's own where they do not. Spans are built from the group's
// records after it ended, with the records' timestamps, so tracing adds
// nothing to the request path and carries nothing the records do not.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/schemas"
)

// Route is what a trace says of a route beyond its name: the provider and
// the model its attempts ask for (gen_ai.provider.name, gen_ai.request.model).
type Route struct {
	Provider string
	Model    string
}

// Options configure an Exporter.
type Options struct {
	// Endpoint is the collector's OTLP/HTTP traces URL.
	Endpoint string
	// Headers go with every export (a collector's API key).
	Headers map[string]string
	// SampleRatio is the share of groups traced when the caller's trace
	// context did not decide.
	SampleRatio float64
	// Service and Version name the process in the traces' resource.
	Service, Version string
	// Routes describe the configured routes, by name.
	Routes map[string]Route
	Logger *slog.Logger
}

// Exporter turns ended groups into spans and sends them in batches; it
// implements dispatcher.Tracer. A collector that is down or slow costs
// dropped spans, never a wait on the group's goroutine.
type Exporter struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	routes   map[string]Route
}

var _ dispatcher.Tracer = (*Exporter)(nil)

// New starts an Exporter sending to o.Endpoint.
func New(o Options) (*Exporter, error) {
	exp, err := otlptracehttp.New(context.Background(),
		otlptracehttp.WithEndpointURL(o.Endpoint), otlptracehttp.WithHeaders(o.Headers))
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter for %s: %w", o.Endpoint, err)
	}
	return newExporter(sdktrace.NewBatchSpanProcessor(exp), o)
}

// newExporter is New with the span processor given: tests export through
// an in-memory one.
func newExporter(sp sdktrace.SpanProcessor, o Options) (*Exporter, error) {
	attrs := []attribute.KeyValue{attribute.String("service.name", o.Service)}
	if o.Version != "" {
		attrs = append(attrs, attribute.String("service.version", o.Version))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(sp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
	)
	if o.Logger != nil {
		// The SDK reports export failures through the global handler; the
		// process's log says them, at most as often as batches fail.
		setErrorLogger(o.Logger)
	}
	return &Exporter{provider: provider, tracer: provider.Tracer("github.com/hedgerow/hedgerow/dispatcher"), routes: o.Routes}, nil
}

// WithRoutes is an Exporter sending through e's batches that describes
// these routes: a gateway's configuration reload swaps its routes, not its
// exporter.
func (e *Exporter) WithRoutes(routes map[string]Route) *Exporter {
	c := *e
	c.routes = routes
	return &c
}

// ParseHeaders reads OTLP headers written as k=v pairs separated by commas,
// as the OTEL_EXPORTER_OTLP_HEADERS variable is. An error never quotes a
// value: they are credentials.
func ParseHeaders(s string) (map[string]string, error) {
	out := map[string]string{}
	for i, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if k = strings.TrimSpace(k); !ok || k == "" {
			return nil, fmt.Errorf("tracing headers: pair %d is not key=value", i+1)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// GroupEnded records the group's span and its attempts' children.
func (e *Exporter) GroupEnded(tl dispatcher.GroupTimeline) {
	ctx := propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": tl.TraceParent})
	g := tl.Group
	operation := operationName(tl)
	ctx, span := e.tracer.Start(ctx, operation+" "+g.RouteClass,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(tl.Start),
		trace.WithAttributes(groupAttributes(operation, g)...))
	if !span.IsRecording() {
		return
	}
	if g.CommittedUnixMs != 0 {
		span.AddEvent("committed", trace.WithTimestamp(time.UnixMilli(g.CommittedUnixMs)),
			trace.WithAttributes(attribute.Int("hedgerow.attempt", g.WinnerAttempt)))
	}
	if g.Outcome != schemas.GroupCommitted {
		span.SetStatus(codes.Error, string(g.ErrorCode))
	}
	for _, a := range tl.Attempts {
		e.attemptSpan(ctx, operation, a)
	}
	span.End(trace.WithTimestamp(tl.End))
}

func (e *Exporter) attemptSpan(ctx context.Context, operation string, a dispatcher.AttemptTimeline) {
	r := a.Record
	route := e.routes[r.Route]
	name := operation
	if route.Model != "" {
		name += " " + route.Model
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", operation),
		attribute.Int64("gen_ai.usage.input_tokens", r.UsageInputUnits),
		attribute.Int64("gen_ai.usage.output_tokens", r.UsageOutputUnits),
		attribute.Int("hedgerow.attempt", r.Attempt),
		attribute.String("hedgerow.role", string(r.Role)),
		attribute.String("hedgerow.route", r.Route),
		attribute.String("hedgerow.outcome", string(r.Outcome)),
		attribute.String("hedgerow.status_class", string(r.StatusClass)),
		attribute.Bool("hedgerow.usage_estimated", r.UsageEstimated),
		attribute.Bool("hedgerow.cancellation_sent", r.CancellationSent),
		attribute.Bool("hedgerow.cancellation_observed", r.CancellationObserved),
	}
	if route.Provider != "" {
		attrs = append(attrs, attribute.String("gen_ai.provider.name", route.Provider))
	}
	if route.Model != "" {
		attrs = append(attrs, attribute.String("gen_ai.request.model", route.Model))
	}
	if r.HTTPStatus != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", r.HTTPStatus))
	}
	if r.FirstByteMs != nil {
		attrs = append(attrs, attribute.Int64("hedgerow.time_to_first_token_ms", *r.FirstByteMs))
	}
	_, span := e.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(a.Launched), trace.WithAttributes(attrs...))
	if r.FirstByteMs != nil {
		span.AddEvent("first_token", trace.WithTimestamp(a.Launched.Add(time.Duration(*r.FirstByteMs)*time.Millisecond)))
	}
	if failed(r.StatusClass) {
		// error.type: the status class, a low-cardinality name of the failure.
		span.SetAttributes(attribute.String("error.type", string(r.StatusClass)))
		span.SetStatus(codes.Error, string(r.StatusClass))
	}
	span.End(trace.WithTimestamp(a.Ended))
}

func groupAttributes(operation string, g schemas.GroupRecord) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", operation),
		attribute.Int64("gen_ai.usage.input_tokens", g.UsageInputUnits),
		attribute.Int64("gen_ai.usage.output_tokens", g.UsageOutputUnits),
		attribute.String("hedgerow.group_id", g.HedgeGroupID),
		attribute.String("hedgerow.pool", g.RouteClass),
		attribute.String("hedgerow.operation_class", g.OperationClass),
		attribute.String("hedgerow.outcome", string(g.Outcome)),
		attribute.Int("hedgerow.attempts", g.Attempts),
		attribute.Bool("hedgerow.hedge_launched", g.HedgeLaunched),
		attribute.Bool("hedgerow.loser_finished_late", g.LoserFinishedLate),
		attribute.Int64("hedgerow.latency_ms", g.ElapsedMs),
		attribute.String("hedgerow.guardrail", string(g.GuardrailDecision)),
	}
	if g.HedgeSuppressedReason != "" {
		attrs = append(attrs, attribute.String("hedgerow.hedge_suppressed_reason", g.HedgeSuppressedReason))
	}
	if g.HedgeDelayMs != nil {
		attrs = append(attrs, attribute.Int64("hedgerow.hedge_delay_ms", *g.HedgeDelayMs))
	}
	if g.FirstByteMs != nil {
		attrs = append(attrs, attribute.Int64("hedgerow.time_to_first_token_ms", *g.FirstByteMs))
	}
	if g.ErrorCode != "" {
		attrs = append(attrs, attribute.String("error.type", string(g.ErrorCode)))
	}
	if g.WinnerRoute != "" {
		attrs = append(attrs, attribute.String("hedgerow.winner_route", g.WinnerRoute),
			attribute.String("hedgerow.winner_role", string(g.WinnerRole)))
	}
	return attrs
}

// operationName is gen_ai.operation.name: "embeddings" or "chat" (chat
// completions, Anthropic Messages and Responses alike).
func operationName(tl dispatcher.GroupTimeline) string {
	if tl.Embeddings {
		return "embeddings"
	}
	return "chat"
}

// failed reports whether an attempt's status class is a failure (a loser
// that was canceled, or is still running when the group ended, is not).
func failed(c schemas.StatusClass) bool {
	return c != schemas.StatusOK && c != schemas.StatusCanceled
}

// Shutdown sends what is queued and stops, within ctx.
func (e *Exporter) Shutdown(ctx context.Context) error {
	if err := e.provider.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// setErrorLogger sends the SDK's errors (a failed export) to log; they name
// the endpoint and the failure, never a header.
func setErrorLogger(log *slog.Logger) {
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("trace export failed", "err", err)
	}))
}
