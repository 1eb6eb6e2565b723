package tracing

import (
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/schemas"
)

const callerTrace = "0af7651916cd43dd8448eb211c80319c"

// hedgedTimeline is a group whose primary stalled and lost to a hedge on
// another route: committed 420ms after the submission, ended at 450ms.
func hedgedTimeline(traceParent string) dispatcher.GroupTimeline {
	start := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	firstByte := int64(90)
	delay := int64(300)
	return dispatcher.GroupTimeline{
		Start: start, End: start.Add(450 * time.Millisecond), TraceParent: traceParent,
		Group: schemas.GroupRecord{
			HedgeGroupID: "g-1", RouteClass: "general", OperationClass: "default", Outcome: schemas.GroupCommitted,
			Attempts: 2, HedgeLaunched: true, WinnerAttempt: 2, WinnerRoute: "b", WinnerRole: schemas.RoleHedge,
			HedgeDelayMs: &delay, ElapsedMs: 420, CommittedUnixMs: start.Add(420 * time.Millisecond).UnixMilli(),
			UsageInputUnits: 20, UsageOutputUnits: 35,
		},
		Attempts: []dispatcher.AttemptTimeline{
			{Launched: start, Ended: start.Add(450 * time.Millisecond), Record: schemas.AttemptRecord{
				Attempt: 1, Role: schemas.RolePrimary, Route: "a", Outcome: schemas.OutcomeLoserCanceled,
				StatusClass: schemas.StatusCanceled, CancellationSent: true, CancellationObserved: true,
				UsageInputUnits: 10, UsageOutputUnits: 5}},
			{Launched: start.Add(300 * time.Millisecond), Ended: start.Add(420 * time.Millisecond), Record: schemas.AttemptRecord{
				Attempt: 2, Role: schemas.RoleHedge, Route: "b", Outcome: schemas.OutcomeWinner, StatusClass: schemas.StatusOK,
				HTTPStatus: 200, FirstByteMs: &firstByte, UsageInputUnits: 10, UsageOutputUnits: 30}},
		},
	}
}

func newRecordingExporter(t *testing.T, ratio float64) (*Exporter, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	e, err := newExporter(rec, Options{SampleRatio: ratio, Service: "hedgerow-gateway",
		Routes: map[string]Route{"a": {Provider: "openai", Model: "gpt-4o"}, "b": {Provider: "anthropic", Model: "claude-sonnet"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(t.Context()) })
	return e, rec
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func TestAGroupIsASpanWithAChildPerAttemptInTheCallersTrace(t *testing.T) {
	e, rec := newRecordingExporter(t, 0) // the caller's sampled flag decides, not the ratio
	tl := hedgedTimeline("00-" + callerTrace + "-b7ad6b7169203331-01")
	e.GroupEnded(tl)
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want the group's and one per attempt (3)", len(spans))
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	group, primary, hedge := byName["chat general"], byName["chat gpt-4o"], byName["chat claude-sonnet"]
	if group == nil || primary == nil || hedge == nil {
		t.Fatalf("span names %v, want chat general, chat gpt-4o, chat claude-sonnet", byName)
	}
	if got := group.SpanContext().TraceID().String(); got != callerTrace {
		t.Fatalf("group span in trace %s, want the caller's %s", got, callerTrace)
	}
	if got := group.Parent().SpanID().String(); got != "b7ad6b7169203331" {
		t.Fatalf("group span's parent %s, want the caller's span", got)
	}
	if group.SpanKind() != trace.SpanKindServer || hedge.SpanKind() != trace.SpanKindClient {
		t.Fatalf("kinds %v, %v; want server for the group, client for an attempt", group.SpanKind(), hedge.SpanKind())
	}
	for _, child := range []sdktrace.ReadOnlySpan{primary, hedge} {
		if child.Parent().SpanID() != group.SpanContext().SpanID() {
			t.Fatalf("%s is not a child of the group's span", child.Name())
		}
	}
	if !group.StartTime().Equal(tl.Start) || !group.EndTime().Equal(tl.End) ||
		!hedge.StartTime().Equal(tl.Attempts[1].Launched) || !hedge.EndTime().Equal(tl.Attempts[1].Ended) {
		t.Fatal("spans do not carry the timeline's instants")
	}
	for _, tt := range []struct {
		span sdktrace.ReadOnlySpan
		key  string
		want attribute.Value
	}{
		{group, "gen_ai.operation.name", attribute.StringValue("chat")},
		{group, "gen_ai.usage.output_tokens", attribute.Int64Value(35)},
		{group, "hedgerow.hedge_delay_ms", attribute.Int64Value(300)},
		{group, "hedgerow.winner_route", attribute.StringValue("b")},
		{hedge, "gen_ai.provider.name", attribute.StringValue("anthropic")},
		{hedge, "gen_ai.request.model", attribute.StringValue("claude-sonnet")},
		{hedge, "gen_ai.usage.output_tokens", attribute.Int64Value(30)},
		{hedge, "hedgerow.time_to_first_token_ms", attribute.Int64Value(90)},
		{hedge, "http.response.status_code", attribute.IntValue(200)},
		{primary, "hedgerow.outcome", attribute.StringValue(string(schemas.OutcomeLoserCanceled))},
		{primary, "hedgerow.cancellation_observed", attribute.BoolValue(true)},
	} {
		if got, ok := attr(tt.span, tt.key); !ok || got != tt.want {
			t.Errorf("%s: %s = %v (present %v), want %v", tt.span.Name(), tt.key, got.Emit(), ok, tt.want.Emit())
		}
	}
	if primary.Status().Code == codes.Error {
		t.Error("a canceled loser is marked as an error")
	}
	if evs := hedge.Events(); len(evs) != 1 || evs[0].Name != "first_token" || !evs[0].Time.Equal(tl.Attempts[1].Launched.Add(90*time.Millisecond)) {
		t.Errorf("hedge's events %v, want first_token at launch + 90ms", evs)
	}
	if evs := group.Events(); len(evs) != 1 || evs[0].Name != "committed" {
		t.Errorf("group's events %v, want committed", evs)
	}
}

func TestSamplingFollowsTheRatioWithoutACallerAndTheCallersFlagWithOne(t *testing.T) {
	for _, tt := range []struct {
		name        string
		ratio       float64
		traceParent string
		wantSpans   int
	}{
		{"no caller, ratio 1: traced", 1, "", 3},
		{"no caller, ratio 0: not traced", 0, "", 0},
		{"caller not sampled, ratio 1: not traced", 1, "00-" + callerTrace + "-b7ad6b7169203331-00", 0},
		{"malformed caller context, ratio 1: a trace of its own", 1, "00-zz-not-a-trace", 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, rec := newRecordingExporter(t, tt.ratio)
			e.GroupEnded(hedgedTimeline(tt.traceParent))
			if got := len(rec.Ended()); got != tt.wantSpans {
				t.Fatalf("%d spans, want %d", got, tt.wantSpans)
			}
		})
	}
}

func TestAFailedGroupAndAFailedAttemptAreErrorsNamingTheirType(t *testing.T) {
	e, rec := newRecordingExporter(t, 1)
	tl := hedgedTimeline("")
	tl.Group.Outcome, tl.Group.ErrorCode, tl.Group.CommittedUnixMs = schemas.GroupFailed, schemas.ErrAllRoutesFailed, 0
	tl.Attempts[1].Record.StatusClass, tl.Attempts[1].Record.Outcome = schemas.StatusServerError, schemas.OutcomeFailed
	e.GroupEnded(tl)
	for _, s := range rec.Ended() {
		typ, _ := attr(s, "error.type")
		switch s.Name() {
		case "chat general":
			if s.Status().Code != codes.Error || typ.AsString() != string(schemas.ErrAllRoutesFailed) {
				t.Errorf("failed group: status %v, error.type %q", s.Status(), typ.AsString())
			}
		case "chat claude-sonnet":
			if s.Status().Code != codes.Error || typ.AsString() != string(schemas.StatusServerError) {
				t.Errorf("failed attempt: status %v, error.type %q", s.Status(), typ.AsString())
			}
		}
	}
}

func TestParseHeadersNeverQuotesAValue(t *testing.T) {
	h, err := ParseHeaders("x-api-key = s3cret , tenant=a=b,")
	if err != nil || h["x-api-key"] != "s3cret" || h["tenant"] != "a=b" || len(h) != 2 {
		t.Fatalf("ParseHeaders: %v, %v", h, err)
	}
	_, err = ParseHeaders("x-api-key=ok,s3cret-without-a-key")
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("a malformed pair: %v; want an error naming its position only", err)
	}
}
