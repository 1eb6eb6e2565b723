package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/internal/config"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestMain checks for leaked goroutines, and silences go-redis' own logger:
// the outage tests stop Redis on purpose, and its every failed dial would
// print a line (the dispatcher counts and logs what matters itself).
func TestMain(m *testing.M) {
	redis.SetLogger(discardRedisLog{})
	goleak.VerifyTestMain(m)
}

type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}

// twoRoutes starts providers a and b sharing one script.
func twoRoutes(t *testing.T, sc *script) (*cluster, map[string]*provider) {
	t.Helper()
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	return newCluster(t, []string{"a", "b"}, ps, ""), ps
}

func TestStalledPrimaryIsHedgedAfterTheDelayAndTheLoserCancelled(t *testing.T) {
	for _, stream := range []bool{false, true} {
		name := map[bool]string{false: "non-streaming", true: "streaming"}[stream]
		t.Run(name, func(t *testing.T) {
			c, ps := twoRoutes(t, newScript(behaviour{words: 5}, behaviour{hang: true}))
			var got strings.Builder
			start := time.Now()
			resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(stream)}, sinkFunc(func(d Delta) error {
				got.WriteString(d.Content)
				return nil
			}))
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if elapsed := time.Since(start); elapsed < 100*time.Millisecond {
				t.Fatalf("answered after %v: the hedge must wait for the 100ms delay", elapsed)
			}
			if !resp.Hedged || resp.Winner != 2 || resp.Attempts != 2 {
				t.Fatalf("response %+v, want the hedge (attempt 2) to win", resp)
			}
			primary := map[string]string{"a": "b", "b": "a"}[resp.WinnerRoute]
			waitGone(t, ps[primary]) // the loser's upstream connection was closed
			text := resp.Content
			if stream {
				text = got.String()
			}
			if !strings.HasPrefix(text, resp.WinnerRoute+"0 ") || strings.Contains(text, primary+"0") {
				t.Fatalf("answer %q mixes routes or is not the winner's (%s)", text, resp.WinnerRoute)
			}
			recs := c.attemptRecords(resp.GroupID, 2)
			if recs[1].Outcome != schemas.OutcomeLoserCanceled || !recs[1].CancellationSent || recs[2].Outcome != schemas.OutcomeWinner {
				t.Fatalf("records %+v / %+v", recs[1], recs[2])
			}
			g := c.groupRecord(resp.GroupID)
			if g.Outcome != schemas.GroupCommitted || !g.HedgeLaunched || g.WinnerAttempt != 2 {
				t.Fatalf("group record %+v", g)
			}
			if n := sampleCount(t, c.d.metrics.cancelDispatch); n != 1 {
				t.Fatalf("hedgerow_cancel_dispatch_seconds counted %d cancels, want the loser's one", n)
			}
		})
	}
}

// sampleCount is how many observations histogram h holds.
func sampleCount(t *testing.T, h prometheus.Histogram) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestDeadlineFailsTheGroupWithAStableError(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{hang: true}))
	start := time.Now()
	_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Deadline: 400 * time.Millisecond, Request: chat(false)}, nil)
	var ge *GroupError
	if !errors.As(err, &ge) || ge.Code != schemas.ErrDeadlineExceeded {
		t.Fatalf("Submit = %v, want deadline_exceeded", err)
	}
	if elapsed := time.Since(start); elapsed < 400*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("failed after %v, want at the 400ms deadline", elapsed)
	}
}

func TestAGroupCountsInFlightFromItsStartUntilItEnds(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{hang: true}, behaviour{hang: true}))
	inFlight := func() float64 { return testutil.ToFloat64(c.d.metrics.inFlight) }
	if n := inFlight(); n != 0 {
		t.Fatalf("%v groups in flight before any was submitted", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.d.Submit(ctx, Submission{Pool: "general", Request: chat(true)}, sinkFunc(func(Delta) error { return nil }))
		done <- err
	}()
	eventually.True(t, 10*time.Second, "the hanging group counted in flight", func() bool { return inFlight() == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a group whose caller left answered")
	}
	eventually.True(t, 10*time.Second, "the ended group no longer in flight", func() bool { return inFlight() == 0 })
}

func TestARouteWithoutAWorkerIsLearntAtOnceAndCostsNoAttemptSlot(t *testing.T) {
	// Routes dark1 and dark2 have no worker (as after a worker's kill -9):
	// an attempt there gets no responders at once and is offered again to
	// a route with a worker, keeping its slot; the picker then passes the
	// dark routes over, so each is asked once (unservedFor outlasts the
	// test), and with max_attempts 2 no request fails while a healthy route
	// idles.
	ps := map[string]*provider{"a": newProvider(t, "a", newScript(behaviour{words: 3}))}
	c := newCluster(t, []string{"dark1", "dark2", "a"}, ps, "")
	c.d.unservedFor = time.Hour
	for i := range 12 {
		id := fmt.Sprintf("g%d", i)
		resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
		if err != nil {
			t.Fatalf("request %s: %v", id, err)
		}
		if resp.WinnerRoute != "a" {
			t.Fatalf("request %s won on %s", id, resp.WinnerRoute)
		}
		if g := c.groupRecord(resp.GroupID); g.Attempts != 1 {
			t.Fatalf("request %s: %d attempts launched, want 1: no responders spends no slot", id, g.Attempts)
		}
	}
	for _, dark := range []string{"dark1", "dark2"} {
		if n := testutil.ToFloat64(c.d.metrics.unserved.WithLabelValues(dark)); n > 1 {
			t.Errorf("route %s found without a worker %v times, want at most once: the picker did not learn it", dark, n)
		}
	}
}

func TestCallerGoneCancelsEveryAttemptWithoutFallback(t *testing.T) {
	c, ps := twoRoutes(t, newScript(behaviour{hang: true}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.d.Submit(ctx, Submission{Pool: "general", Request: chat(true)}, nil)
		done <- err
	}()
	// The primary and, after the delay, the hedge both reach a provider.
	waitArrived(t, ps["a"])
	waitArrived(t, ps["b"])
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit = %v, want context.Canceled", err)
	}
	waitGone(t, ps["a"])
	waitGone(t, ps["b"])
	var g schemas.GroupRecord
	select {
	case g = <-c.groups:
	case <-time.After(10 * time.Second):
		t.Fatal("no group record")
	}
	if g.ErrorCode != schemas.ErrCanceled || g.Attempts != 2 {
		t.Fatalf("group record %+v, want canceled after 2 attempts and no third", g)
	}
	if n := sampleCount(t, c.d.metrics.cancelDispatch); n != 0 {
		t.Fatalf("hedgerow_cancel_dispatch_seconds counted %d cancels of a caller gone, want none: it times lost races", n)
	}
}

type sinkFunc func(Delta) error

func (f sinkFunc) Delta(d Delta) error { return f(d) }

func TestMisbehavingWorkersFailOnlyTheirAttempt(t *testing.T) {
	tests := []struct {
		name       string
		misbehave  func(fw *fakeWorker, a schemas.Attempt)
		wantStatus schemas.StatusClass
	}{
		{"a worker that never accepts", func(fw *fakeWorker, a schemas.Attempt) {}, schemas.StatusLost},
		{"a worker whose heartbeats stop", func(fw *fakeWorker, a schemas.Attempt) {
			fw.accept(a)
			fw.send(a, schemas.Heartbeat{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1})
		}, schemas.StatusLost},
		{"a stream with a sequence gap", func(fw *fakeWorker, a schemas.Attempt) {
			fw.accept(a)
			fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
			fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 2, Delta: "x", Tokens: 1, CumulativeTokens: 1, First: true})
		}, schemas.StatusLost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The hedge delay is longer than the accept and heartbeat
			// timeouts, so what replaces the attempt is a replacement.
			c := newCluster(t, []string{"a", "b"}, nil, `
  patient:
    control_fraction: 0
    delay: {initial: 5s, min: 10ms, warmup_samples: 1000000}
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
`)
			startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
				if a.Attempt == 1 {
					tc.misbehave(fw, a)
					return
				}
				fw.answer(a, "replacement answer")
			})
			resp, err := c.d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: chat(true)}, nil)
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if resp.Winner != 2 || resp.Hedged {
				t.Fatalf("response %+v, want the replacement (attempt 2) to win", resp)
			}
			recs := c.attemptRecords(resp.GroupID, 2)
			if recs[1].Outcome != schemas.OutcomeFailed || recs[1].StatusClass != tc.wantStatus || recs[1].ErrorScope != schemas.ScopeTransient {
				t.Fatalf("attempt 1 record %+v, want failed %s transient", recs[1], tc.wantStatus)
			}
		})
	}
}

func TestLateResultIsRecordedNotCommitted(t *testing.T) {
	c := newCluster(t, []string{"a", "b"}, nil, "")
	release := make(chan struct{})
	fw := startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
		if a.Attempt == 2 {
			fw.answer(a, "the hedge's answer")
			return
		}
		// The primary stalls past the delay, is cancelled, and completes anyway.
		fw.accept(a)
		<-release
		fw.send(a, schemas.AttemptResult{GroupID: a.GroupID, Attempt: a.Attempt, WorkerID: "fake", StatusClass: schemas.StatusOK,
			ErrorScope: schemas.ScopeNone, FinishReason: "stop", Content: "the primary's answer", Usage: schemas.Usage{InputUnits: 10, OutputUnits: 7}})
	})
	resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	if resp.Winner != 2 || resp.Content != "the hedge's answer" {
		t.Fatalf("response %+v, want the hedge's answer", resp)
	}
	select {
	case cancel := <-fw.cancels:
		if cancel.Attempt != 1 || cancel.Reason != schemas.CancelReason("lost_race") {
			t.Fatalf("cancel %+v, want attempt 1 lost_race", cancel)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the primary was never cancelled")
	}
	close(release)
	recs := c.attemptRecords(resp.GroupID, 2)
	if recs[1].Outcome != schemas.OutcomeLoserLate || recs[1].UsageOutputUnits != 7 {
		t.Fatalf("primary record %+v, want a late loser with its usage", recs[1])
	}
	if g := c.groupRecord(resp.GroupID); !g.LoserFinishedLate || g.WinnerAttempt != 2 || g.UsageOutputUnits != 10 {
		t.Fatalf("group record %+v", g)
	}
}

// TestAnAnswerOutsideTheContractNeverWins: the hedge answers first but its
// answer fails the request's response_format; the primary keeps running and
// its valid answer is the one committed.
func TestAnAnswerOutsideTheContractNeverWins(t *testing.T) {
	const schema = `{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","required":["answer"],"properties":{"answer":{"type":"integer"}}}}}`
	const valid = `{"answer":42}`
	tests := []struct {
		name  string
		hedge behaviour
	}{
		{"schema-failing", behaviour{content: `{"answer":"forty-two"}`}},
		{"truncated", behaviour{content: `{"answer":4`, finish: "length"}},
		{"malformed", behaviour{content: `answer: 42`}},
		{"incomplete finish", behaviour{content: valid, finish: "content_filter"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			slowValid := behaviour{firstByte: 400 * time.Millisecond, content: valid}
			c, _ := twoRoutes(t, newScript(slowValid, slowValid, tt.hedge))
			req := chat(false)
			req.ResponseFormat = []byte(schema)
			resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: req}, nil)
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if resp.Content != valid || resp.Winner == 2 {
				t.Fatalf("committed attempt %d with %q; want the primary's %s", resp.Winner, resp.Content, valid)
			}
			if !resp.Hedged {
				t.Fatal("the hedge was never launched: the test did not exercise the contract")
			}
		})
	}
}

func TestAResponseFormatTheContractCannotHonourIsABadRequest(t *testing.T) {
	c, _ := twoRoutes(t, newScript(behaviour{words: 1}))
	req := chat(false)
	req.ResponseFormat = []byte(`{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"no-such-type"}}}`)
	_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: req}, nil)
	if !errors.Is(err, ErrBadRequest) {
		t.Fatalf("Submit = %v, want ErrBadRequest", err)
	}
}

// TestHedgedStreamCarriesOnlyTheAttemptWhoseFirstTokenCameFirst: with both
// attempts running, the caller's stream is whole, in order, and from one
// attempt — the hedge's when the primary stalls before its first token, the
// primary's when its first token comes before the hedge's.
func TestHedgedStreamCarriesOnlyTheAttemptWhoseFirstTokenCameFirst(t *testing.T) {
	tests := []struct {
		name       string
		primary    behaviour
		hedge      behaviour
		wantWinner int
	}{
		{"primary stalls: the hedge's stream", behaviour{hang: true}, behaviour{words: 6}, 2},
		{"primary's first token first: the primary's stream",
			behaviour{firstByte: 150 * time.Millisecond, words: 6}, behaviour{firstByte: 600 * time.Millisecond, words: 6}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := twoRoutes(t, newScript(behaviour{words: 6}, tt.primary, tt.hedge))
			var deltas []string
			resp, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true)}, sinkFunc(func(d Delta) error {
				deltas = append(deltas, d.Content)
				return nil
			}))
			if err != nil {
				t.Fatalf("Submit: %v", err)
			}
			if !resp.Hedged || resp.Winner != tt.wantWinner {
				t.Fatalf("hedged %v, winner %d; want a hedge and winner %d", resp.Hedged, resp.Winner, tt.wantWinner)
			}
			var want strings.Builder
			for i := range 6 {
				fmt.Fprintf(&want, "%s%d ", resp.WinnerRoute, i)
			}
			if got := strings.Join(deltas, ""); got != want.String() {
				t.Fatalf("stream %q, want exactly the winner's %q", got, want.String())
			}
		})
	}
}

// TestATenantsOwnSpendLimitRefusesWithTheRestOfItsWindow: a tenant's
// spend_limit applies across classes; a refused caller learns when the
// window rolls over.
func TestATenantsOwnSpendLimitRefusesWithTheRestOfItsWindow(t *testing.T) {
	tenants := fmt.Sprintf("tenants:\n  small:\n    api_key_hashes: [%q]\n    spend_limit: 5\n    spend_window: 1h\n", config.HashAPIKey("k"))
	c := newCluster(t, []string{"a", "b"}, map[string]*provider{"a": newProvider(t, "a", newScript(behaviour{words: 1}))}, tenants)
	_, err := c.d.Submit(context.Background(), Submission{Pool: "general", Tenant: "small", Request: chat(false)}, nil)
	var ge *GroupError
	if !errors.As(err, &ge) || ge.Code != schemas.ErrBudgetExhausted {
		t.Fatalf("Submit = %v, want budget_exhausted: the request's estimate exceeds the tenant's 5 units", err)
	}
	if ge.RetryAfter <= 0 || ge.RetryAfter > time.Hour {
		t.Fatalf("RetryAfter = %v, want the rest of the hour-long window", ge.RetryAfter)
	}
	if _, err := c.d.Submit(context.Background(), Submission{Pool: "general", Tenant: "other", Request: chat(false)}, nil); err != nil {
		t.Fatalf("a tenant without a limit: %v", err)
	}
}
