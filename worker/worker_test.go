package worker

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/simulator/fakellm"
	"github.com/hedgerow/hedgerow/simulator/workload"
)

// metric reads one series of the worker's metrics: a counter's or gauge's
// value, or a histogram's sample count.
func (h *harness) metric(name string, labels ...string) float64 {
	h.t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := h.metrics.Register(reg); err != nil {
		h.t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}

// chunks checks the stream rules on replies after Accept — heartbeats with
// Seq from 1 without gaps, before and after FirstByte, FirstByte at most once, chunks only after
// it with Seq from 1 without gaps, First on the first chunk alone — and
// returns the chunks and the heartbeat count.
func checkStream(t *testing.T, rs []schemas.Reply) (chunks []*schemas.Chunk, heartbeats int64, firstByte bool) {
	t.Helper()
	var cum int64
	for _, r := range rs {
		switch m := r.(type) {
		case *schemas.Heartbeat:
			heartbeats++
			if m.Seq != heartbeats {
				t.Fatalf("heartbeat seq %d, want %d", m.Seq, heartbeats)
			}
		case *schemas.FirstByte:
			if firstByte {
				t.Fatalf("second first byte: %v", kinds(rs))
			}
			firstByte = true
		case *schemas.Chunk:
			if !firstByte {
				t.Fatalf("chunk before the first byte: %v", kinds(rs))
			}
			chunks = append(chunks, m)
			if m.Seq != int64(len(chunks)) {
				t.Fatalf("chunk seq %d, want %d (gapless from 1)", m.Seq, len(chunks))
			}
			if m.First != (m.Seq == 1) {
				t.Errorf("chunk %d has First=%v", m.Seq, m.First)
			}
			cum += m.Tokens
			if m.CumulativeTokens != cum {
				t.Errorf("chunk %d cumulative tokens %d, want %d", m.Seq, m.CumulativeTokens, cum)
			}
		case *schemas.AttemptResult:
		default:
			t.Fatalf("unexpected %s after accept: %v", r.ReplyType(), kinds(rs))
		}
	}
	return chunks, heartbeats, firstByte
}

func TestStreamingAttemptSendsAcceptHeartbeatsFirstByteChunksThenOneResult(t *testing.T) {
	// First byte after 50 ms, heartbeats every 5 ms, 40 tokens at once.
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 50, 40, 1000)}})
	att := h.attempt("hg_stream")
	in := h.send(att)

	acc := in.accept()
	if acc.GroupID != att.GroupID || acc.Attempt != 1 || acc.WorkerID != "worker-test-1" || acc.ControlInbox != h.w.ControlInbox() {
		t.Errorf("accept = %+v", acc)
	}
	rs, res := in.untilResult()
	chunks, heartbeats, firstByte := checkStream(t, rs)
	if heartbeats == 0 || !firstByte || len(chunks) == 0 {
		t.Fatalf("replies %v: want heartbeats, a first byte and chunks", kinds(rs))
	}
	if chunks[0].Tokens != 1 || chunks[0].Delta == "" {
		t.Errorf("first chunk = %+v, want the first token alone, sent at once", chunks[0])
	}
	var text strings.Builder
	for _, c := range chunks {
		text.WriteString(c.Delta)
		if c.Tokens > DefaultCoalesceTokens {
			t.Errorf("chunk %d holds %d tokens, more than %d", c.Seq, c.Tokens, DefaultCoalesceTokens)
		}
	}
	last := chunks[len(chunks)-1]
	want := schemas.Usage{InputUnits: 100, OutputUnits: 40}
	switch {
	case res.StatusClass != schemas.StatusOK || res.ErrorScope != schemas.ScopeNone:
		t.Errorf("result %s/%s, want ok/none", res.StatusClass, res.ErrorScope)
	case res.Usage != want || last.CumulativeTokens != 40:
		t.Errorf("usage %+v and %d streamed tokens, want %+v and 40", res.Usage, last.CumulativeTokens, want)
	case res.LastSeq != last.Seq:
		t.Errorf("last_seq %d, want %d", res.LastSeq, last.Seq)
	case res.FinishReason != "stop" || res.HTTPStatus != 200 || res.CancellationObserved:
		t.Errorf("result = %+v", res)
	case res.Content != "" || res.ToolCalls != nil:
		t.Errorf("a streaming caller got the answer in the result too: %q", res.Content)
	case res.FirstByteMs == nil || *res.FirstByteMs < 50 || res.ElapsedMs < *res.FirstByteMs:
		t.Errorf("first_byte_ms %v elapsed_ms %d: want ≥ 50 and elapsed after it", res.FirstByteMs, res.ElapsedMs)
	}
	if len(strings.Fields(text.String())) != 40 {
		t.Errorf("streamed text has %d words, want 40", len(strings.Fields(text.String())))
	}

	rec := h.record()
	wantFP, err := att.Request.Fingerprint([]byte("test-fingerprint-key"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Reporter != schemas.ReporterWorker || rec.Outcome != schemas.OutcomeCompleted ||
		rec.StatusClass != schemas.StatusOK || rec.UsageInputUnits != 100 || rec.UsageOutputUnits != 40 ||
		rec.WorkerID != "worker-test-1" || rec.PromptFingerprint != wantFP || rec.CancellationSent {
		t.Errorf("record = %+v", rec)
	}
	// The record follows the result on the worker's connection: nothing
	// came on the inbox after the result.
	if n, _, _ := in.sub.Pending(); n != 0 {
		t.Errorf("%d messages after the result", n)
	}
	if got := h.metric("hedgerow_worker_attempts_total", "route", testRoute, "status", "ok"); got != 1 {
		t.Errorf("attempts_total{ok} = %v, want 1", got)
	}
	if got := h.metric("hedgerow_worker_inflight", "route", testRoute); got != 0 {
		t.Errorf("inflight = %v after the attempt, want 0", got)
	}
}

func TestChunksCoalesceUpToTheTokenThreshold(t *testing.T) {
	// Tokens arrive together; with no time limit a chunk closes at 16 tokens.
	h := newHarness(t, setup{
		fake:   fakellm.Options{Model: model(t, 1, 40, 1e6)},
		config: func(c *Options) { c.CoalesceDelay = time.Hour },
	})
	in := h.send(h.attempt("hg_tokens"))
	in.accept()
	rs, _ := in.untilResult()
	chunks, _, _ := checkStream(t, rs)
	var sizes []int64
	for _, c := range chunks {
		sizes = append(sizes, c.Tokens)
	}
	if want := []int64{1, 16, 16, 7}; !slices.Equal(sizes, want) {
		t.Errorf("chunk sizes %v, want %v", sizes, want)
	}
}

func TestChunksFlushAfterTheCoalesceDelay(t *testing.T) {
	// One token per millisecond for 40 ms, a 5 ms delay and a threshold
	// never reached: only the delay can split the stream after its first chunk.
	h := newHarness(t, setup{
		fake:   fakellm.Options{Model: model(t, 1, 40, 1)},
		config: func(c *Options) { c.CoalesceTokens = 1000 },
	})
	in := h.send(h.attempt("hg_delay"))
	in.accept()
	rs, res := in.untilResult()
	chunks, _, _ := checkStream(t, rs)
	if len(chunks) < 3 {
		t.Errorf("%d chunks for a 40 ms stream with a 5 ms delay, want the delay to flush some", len(chunks))
	}
	if res.Usage.OutputUnits != 40 || chunks[len(chunks)-1].CumulativeTokens != 40 {
		t.Errorf("usage %+v, streamed %d tokens; want 40", res.Usage, chunks[len(chunks)-1].CumulativeTokens)
	}
}

func TestNonStreamingCallerGetsTheWholeAnswerInTheResultAndNoChunks(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 20, 40, 1000)}})
	att := h.attempt("hg_whole")
	att.Request.Stream = false
	att.CommitPoint = schemas.Complete
	in := h.send(att)
	in.accept()
	rs, res := in.untilResult()
	chunks, _, firstByte := checkStream(t, rs)
	if len(chunks) != 0 || !firstByte {
		t.Errorf("replies %v: want a first byte and no chunks", kinds(rs))
	}
	if res.StatusClass != schemas.StatusOK || len(strings.Fields(res.Content)) != 40 || res.LastSeq != 0 ||
		res.Usage != (schemas.Usage{InputUnits: 100, OutputUnits: 40}) {
		t.Errorf("result = %+v", res)
	}
}

// hangModel never sends a first byte.
func hangModel(t *testing.T) *workload.Model {
	m := model(t, 1, 40, 1000)
	m.TTFT.HangFraction = 1
	return m
}

func TestAttemptBeyondMaxInflightIsAnsweredBusy(t *testing.T) {
	h := newHarness(t, setup{
		fake:   fakellm.Options{Model: hangModel(t)},
		config: func(c *Options) { c.MaxInflight = 1 },
	})
	a := h.send(h.attempt("hg_first"))
	accA := a.accept()
	b := h.send(h.attempt("hg_second"))
	busy, ok := b.next().(*schemas.Busy)
	if !ok || busy.GroupID != "hg_second" || busy.WorkerID != "worker-test-1" {
		t.Fatalf("second attempt got %+v, want busy", busy)
	}
	if n, _, _ := b.sub.Pending(); n != 0 {
		t.Errorf("%d more messages after busy", n)
	}
	h.cancel(accA, schemas.CancelCallerGone)
	if _, res := a.untilResult(); res.StatusClass != schemas.StatusCanceled {
		t.Errorf("first attempt ended %s, want canceled", res.StatusClass)
	}
	if got := h.metric("hedgerow_worker_attempts_total", "status", "busy"); got != 1 {
		t.Errorf("attempts_total{busy} = %v, want 1", got)
	}
}

func TestCancelStopsTheUpstreamAndReportsCanceledObserved(t *testing.T) {
	// 1000 tokens, one per millisecond: the cancel comes mid-stream.
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 1000, 1)}})
	in := h.send(h.attempt("hg_cancel"))
	acc := in.accept()
	var before []schemas.Reply
	for {
		r := in.next()
		before = append(before, r)
		if c, ok := r.(*schemas.Chunk); ok && c.First {
			break
		}
	}
	h.cancel(acc, schemas.CancelLostRace)
	rs, res := in.untilResult()
	chunks, _, _ := checkStream(t, append(before, rs...))

	if res.StatusClass != schemas.StatusCanceled || res.ErrorScope != schemas.ScopeNone || !res.CancellationObserved {
		t.Errorf("result %s/%s observed=%v, want canceled/none/true", res.StatusClass, res.ErrorScope, res.CancellationObserved)
	}
	if res.LastSeq != chunks[len(chunks)-1].Seq {
		t.Errorf("last_seq %d, want %d", res.LastSeq, chunks[len(chunks)-1].Seq)
	}
	if res.Usage.OutputUnits < 1 || !res.Usage.Estimated || res.Usage.OutputUnits >= 1000 {
		t.Errorf("usage %+v: want the observed tokens, flagged estimated", res.Usage)
	}
	if prov := h.prov.record(t); prov.End != fakellm.EndDisconnected || prov.TokensSent >= 1000 {
		t.Errorf("provider saw end %s after %d tokens, want a disconnect mid-stream", prov.End, prov.TokensSent)
	}
	rec := h.record()
	if rec.Outcome != schemas.OutcomeLoserCanceled || !rec.CancellationSent || !rec.CancellationObserved || !rec.UsageEstimated {
		t.Errorf("record = %+v", rec)
	}
	// The worker counts the cancel after it has published the result and
	// the record.
	eventually.True(t, wait, "cancellations_total{observed=true} and one cancel_latency_seconds sample", func() bool {
		return h.metric("hedgerow_worker_cancellations_total", "observed", "true") == 1 &&
			h.metric("hedgerow_cancel_latency_seconds") == 1
	})
}

func TestCancelArrivingBeforeItsAttemptStillCancelsIt(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 40, 1000)}})
	att := h.attempt("hg_early")
	data, err := schemas.Cancel{GroupID: att.GroupID, Attempt: att.Attempt, Reason: schemas.CancelLostRace, Secret: att.Secret}.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	// Handled here, synchronously, so it is certain to precede the attempt.
	h.w.handleControl(&nats.Msg{Subject: h.w.ControlInbox(), Data: data})

	in := h.send(att)
	in.accept()
	rs, res := in.untilResult()
	if len(rs) != 1 {
		t.Errorf("replies after accept %v, want the result alone", kinds(rs))
	}
	if res.StatusClass != schemas.StatusCanceled || !res.CancellationObserved || res.Usage != (schemas.Usage{}) || res.FirstByteMs != nil {
		t.Errorf("result = %+v, want canceled, observed, nothing consumed", res)
	}
	if rec := h.record(); rec.Outcome != schemas.OutcomeLoserCanceled {
		t.Errorf("record outcome %s, want loser_canceled", rec.Outcome)
	}
	stats, err := h.prov.fake.Stats(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if stats.Totals.Requests != 0 {
		t.Errorf("the provider got %d requests for a cancelled attempt", stats.Totals.Requests)
	}
	if got := h.metric("hedgerow_worker_cancellations_total", "observed", "true"); got != 1 {
		t.Errorf("cancellations_total{observed=true} = %v, want 1", got)
	}
}

func TestDeadlineBoundsTheUpstreamCall(t *testing.T) {
	fixed := time.Date(2026, 7, 31, 12, 0, 0, 0, time.UTC)
	for name, tc := range map[string]struct {
		now        func() time.Time
		deadline   time.Time
		remaining  time.Duration
		wantCalled bool
	}{
		"remaining budget ends first": {
			now: time.Now, deadline: time.Now().Add(time.Hour), remaining: 40 * time.Millisecond, wantCalled: true,
		},
		"absolute deadline ends first": {
			now: func() time.Time { return fixed }, deadline: fixed.Add(40 * time.Millisecond), remaining: time.Hour, wantCalled: true,
		},
		"deadline passed before arrival": {
			now: func() time.Time { return fixed }, deadline: fixed.Add(-time.Millisecond), remaining: time.Hour,
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, setup{
				fake:   fakellm.Options{Model: hangModel(t)},
				config: func(c *Options) { c.Now = tc.now },
			})
			att := h.attempt("hg_deadline")
			att.DeadlineUnixMs, att.RemainingMs = tc.deadline.UnixMilli(), tc.remaining.Milliseconds()
			in := h.send(att)
			in.accept()
			_, res := in.untilResult()
			if res.StatusClass != schemas.StatusTimeout || res.ErrorScope != schemas.ScopeTransient || res.CancellationObserved {
				t.Errorf("result %s/%s, want timeout/transient", res.StatusClass, res.ErrorScope)
			}
			if rec := h.record(); rec.Outcome != schemas.OutcomeFailed {
				t.Errorf("record outcome %s, want failed", rec.Outcome)
			}
			if !tc.wantCalled {
				stats, err := h.prov.fake.Stats(0, 0)
				if err != nil {
					t.Fatal(err)
				}
				if stats.Totals.Requests != 0 {
					t.Errorf("the provider got %d requests past the deadline", stats.Totals.Requests)
				}
				return
			}
			if prov := h.prov.record(t); prov.End != fakellm.EndDisconnected {
				t.Errorf("provider saw end %s, want the worker to disconnect at the deadline", prov.End)
			}
		})
	}
}

func TestUpstreamErrorsMapToStatusAndScope(t *testing.T) {
	serverError := func(t *testing.T) *workload.Model {
		m := model(t, 1, 40, 1000)
		m.ErrorFraction = 1
		m.ErrorAfterMin, m.ErrorAfterMax = 10*time.Millisecond, 10*time.Millisecond
		return m
	}
	for name, tc := range map[string]struct {
		fake        func(t *testing.T) fakellm.Options
		unreachable bool
		before      func(t *testing.T, h *harness)
		status      schemas.StatusClass
		scope       schemas.ErrorScope
		http        int
		retryAfter  bool
	}{
		"provider 500 is transient": {
			fake:   func(t *testing.T) fakellm.Options { return fakellm.Options{Model: serverError(t)} },
			status: schemas.StatusServerError, scope: schemas.ScopeTransient, http: 500,
		},
		"provider 429 is pushback with retry-after": {
			fake: func(t *testing.T) fakellm.Options {
				return fakellm.Options{Model: model(t, 1, 40, 1000), RateLimit: workload.RateLimit{RPM: 1}}
			},
			before: func(t *testing.T, h *harness) {
				// Spend the route's one request a minute.
				req := h.attempt("hg_spend").Request
				req.Messages[0].Content = schemas.TextContent("another prompt")
				if _, err := h.prov.upstream.Stream(context.Background(), &req, nil); err != nil {
					t.Fatalf("spending the rate limit: %v", err)
				}
				h.prov.record(t)
			},
			status: schemas.StatusRateLimited, scope: schemas.ScopePushback, http: 429, retryAfter: true,
		},
		"unreachable base url is transient": {
			fake:        func(t *testing.T) fakellm.Options { return fakellm.Options{Model: model(t, 1, 40, 1000)} },
			unreachable: true,
			status:      schemas.StatusServerError, scope: schemas.ScopeTransient,
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := setup{fake: tc.fake(t)}
			if tc.unreachable {
				closed := startProvider(t, fakellm.Options{Model: model(t, 1, 40, 1000)}, nil)
				closed.http.Close()
				s.upstream = closed.upstream
			}
			h := newHarness(t, s)
			if tc.before != nil {
				tc.before(t, h)
			}
			in := h.send(h.attempt("hg_error"))
			in.accept()
			rs, res := in.untilResult()
			if chunks, _, firstByte := checkStream(t, rs); firstByte || len(chunks) != 0 {
				t.Errorf("replies %v: a failed call has no first byte or chunks", kinds(rs))
			}
			if res.StatusClass != tc.status || res.ErrorScope != tc.scope || res.HTTPStatus != tc.http {
				t.Errorf("result %s/%s/%d, want %s/%s/%d", res.StatusClass, res.ErrorScope, res.HTTPStatus, tc.status, tc.scope, tc.http)
			}
			if (res.RetryAfterMs > 0) != tc.retryAfter {
				t.Errorf("retry_after_ms %d, want present=%v", res.RetryAfterMs, tc.retryAfter)
			}
			if res.ErrorMessage == "" || res.Usage != (schemas.Usage{}) {
				t.Errorf("result %+v: want a sanitized message and no usage for a refused call", res)
			}
			if rec := h.record(); rec.Outcome != schemas.OutcomeFailed || rec.ErrorScope != tc.scope {
				t.Errorf("record %s/%s, want failed/%s", rec.Outcome, rec.ErrorScope, tc.scope)
			}
		})
	}
}

func TestUnreadableAttemptsAreDroppedAndCounted(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}})
	for i, tc := range []struct {
		name, reason string
		body         func(reply string) string
	}{
		{"major version 2", DropVersion, func(r string) string {
			return `{"v":2,"group_id":"hg_v2","attempt":1,"reply_inbox":"` + r + `","request":{"messages":[]}}`
		}},
		{"no version", DropVersion, func(r string) string { return `{"group_id":"hg_v0","attempt":1,"reply_inbox":"` + r + `"}` }},
		{"not json", DropMalformed, func(r string) string { return `{"v":1,` }},
		{"no attempt number", DropMalformed, func(r string) string { return `{"v":1,"group_id":"hg_n","reply_inbox":"` + r + `"}` }},
		// Its record would carry commit_point "", which no reader takes
		// (found by schemas.FuzzWireMessageRoundTrips).
		{"no commit point", DropMalformed, func(r string) string {
			return `{"v":1,"group_id":"hg_c","attempt":1,"reply_inbox":"` + r + `","secret":"0123456789abcdef0123456789abcdef","request":{"messages":[{"role":"user","content":"hi"}]}}`
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			badInbox := h.dc.NewInbox()
			bad, err := h.dc.SubscribeSync(badInbox)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.dc.Publish(schemas.AttemptSubject(testRoute), []byte(tc.body(badInbox))); err != nil {
				t.Fatal(err)
			}
			// Attempts are handled in order: once the next one is answered,
			// an answer to the bad one would already have arrived.
			in := h.send(h.attempt("hg_after"))
			in.accept()
			in.untilResult()
			h.record()
			if n, _, _ := bad.Pending(); n != 0 {
				t.Errorf("the dropped attempt got %d replies", n)
			}
			want := map[string]float64{DropVersion: 0, DropMalformed: 0}
			for _, prev := range []string{"major version 2", "no version", "not json", "no attempt number", "no commit point"}[:i+1] {
				if prev == "not json" || prev == "no attempt number" || prev == "no commit point" {
					want[DropMalformed]++
				} else {
					want[DropVersion]++
				}
			}
			for reason, n := range want {
				if got := h.metric("hedgerow_worker_dropped_total", "reason", reason); got != n {
					t.Errorf("dropped_total{%s} = %v, want %v", reason, got, n)
				}
			}
		})
	}
}

func TestMicroServiceAnswersPingWithTheRoute(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}})
	msg, err := h.dc.Request("$SRV.PING."+schemas.WorkerServiceName, nil, wait)
	if err != nil {
		t.Fatalf("ping: %v", err)
	}
	var ping micro.Ping
	if err := json.Unmarshal(msg.Data, &ping); err != nil {
		t.Fatal(err)
	}
	if ping.Name != schemas.WorkerServiceName || ping.Metadata["route"] != testRoute || ping.Metadata["worker_id"] != "worker-test-1" {
		t.Errorf("ping = %+v", ping)
	}
}

func TestStopFinishesInflightAttemptsAndTakesNoNewWork(t *testing.T) {
	gate := make(chan struct{})
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 40, 1000)}, gate: gate})
	drained := make(chan struct{})
	h.w.testHookDrained = func() { close(drained) }

	inflight := h.send(h.attempt("hg_inflight"))
	inflight.accept()
	<-h.prov.arrived // the call is at the provider, held by the gate

	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		stopped <- h.w.Stop(ctx)
	}()
	select {
	case <-drained:
	case <-time.After(wait):
		t.Fatal("Stop did not stop taking attempts")
	}

	// An attempt still queued in the client when the drain began is
	// answered busy, so the dispatcher replaces it at once.
	queued := h.attempt("hg_queued")
	qin := h.listen(queued)
	data, err := queued.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	h.w.handleAttempt(&nats.Msg{Subject: schemas.AttemptSubject(testRoute), Data: data})
	if r := qin.next(); r.ReplyType() != schemas.ReplyBusy {
		t.Errorf("queued attempt got %s, want busy", r.ReplyType())
	}
	// A new attempt finds no worker at all: the dispatcher hears no responders.
	fresh := h.attempt("hg_fresh")
	fin := h.listen(fresh)
	if data, err = fresh.MarshalJSON(); err != nil {
		t.Fatal(err)
	}
	if err := h.dc.PublishRequest(schemas.AttemptSubject(testRoute), fresh.ReplyInbox, data); err != nil {
		t.Fatal(err)
	}
	if _, err := fin.sub.NextMsg(wait); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("new attempt: %v, want no responders", err)
	}
	if _, err := h.dc.Request("$SRV.PING."+schemas.WorkerServiceName, nil, wait); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("ping while stopping: %v, want no responders", err)
	}

	close(gate)
	if _, res := inflight.untilResult(); res.StatusClass != schemas.StatusOK {
		t.Errorf("in-flight attempt ended %s, want ok", res.StatusClass)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Stop: %v", err)
	}
}

func TestStopCancelsAttemptsStillRunningAfterTheDrainGrace(t *testing.T) {
	h := newHarness(t, setup{
		fake:   fakellm.Options{Model: hangModel(t)},
		config: func(c *Options) { c.DrainGrace = 20 * time.Millisecond },
	})
	in := h.send(h.attempt("hg_hung"))
	in.accept()
	<-h.prov.arrived
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := h.w.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	_, res := in.untilResult()
	if res.StatusClass != schemas.StatusCanceled || res.ErrorScope != schemas.ScopeTransient || res.CancellationObserved {
		t.Errorf("result %s/%s observed=%v, want canceled/transient/false so the dispatcher replaces it",
			res.StatusClass, res.ErrorScope, res.CancellationObserved)
	}
	if rec := h.record(); rec.Outcome != schemas.OutcomeFailed {
		t.Errorf("record outcome %s, want failed", rec.Outcome)
	}
	if prov := h.prov.record(t); prov.End != fakellm.EndDisconnected {
		t.Errorf("provider saw end %s, want a disconnect", prov.End)
	}
}

func TestLifecycleRejectsMisuse(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}, noStart: true})
	ctx := context.Background()
	if err := h.w.Stop(ctx); !errors.Is(err, ErrNotStarted) {
		t.Errorf("Stop before Start: %v, want ErrNotStarted", err)
	}
	if err := h.w.Start(); err != nil {
		t.Fatal(err)
	}
	if err := h.w.Start(); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start: %v, want ErrStarted", err)
	}
	if err := h.w.Stop(ctx); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if err := h.w.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v, want nil", err)
	}
}

func TestStopAfterTheConnectionClosedReturnsWithoutWaiting(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 4, 1000)}})
	h.w.cfg.Conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := h.w.Stop(ctx); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("Stop: %v, want it to report the closed connection", err)
	}
	if ctx.Err() != nil {
		t.Error("Stop waited for its context on a closed connection")
	}
}

func TestCancelWithoutTheAttemptsSecretIsNotObeyed(t *testing.T) {
	// The attempt hangs before its first byte: only a cancel ends it.
	h := newHarness(t, setup{fake: fakellm.Options{Model: hangModel(t)}})
	att := h.attempt("hg_forged_cancel")
	in := h.send(att)
	acc := in.accept()
	other, err := schemas.NewAttemptSecret()
	if err != nil {
		t.Fatal(err)
	}
	flip := "0"
	if att.Secret[31] == '0' {
		flip = "1"
	}
	forged := []struct {
		name   string
		secret string
	}{
		{"no secret", ""},
		{"another attempt's secret", other},
		{"the secret with its last digit changed", att.Secret[:31] + flip},
		{"a prefix of the secret", att.Secret[:16]},
		{"the secret in upper case", strings.ToUpper(att.Secret)},
	}
	for i, f := range forged {
		h.publish(acc.ControlInbox, schemas.Cancel{GroupID: att.GroupID, Attempt: att.Attempt, Reason: schemas.CancelCallerGone, Secret: f.secret})
		eventually.True(t, wait, "cancel with "+f.name+" rejected", func() bool {
			return h.metric("hedgerow_worker_cancels_rejected_total", "reason", RejectSecret) == float64(i+1)
		})
	}
	// Every forged cancel has been handled; the attempt still runs: the
	// cancel that carries its secret is the one that ends it.
	h.cancel(acc, schemas.CancelLostRace)
	rs, res := in.untilResult()
	for _, r := range rs[:len(rs)-1] {
		if r.ReplyType() != schemas.ReplyHeartbeat {
			t.Errorf("replies %v before the result, want heartbeats", kinds(rs))
			break
		}
	}
	if res.StatusClass != schemas.StatusCanceled || !res.CancellationObserved {
		t.Errorf("result %s observed=%v, want canceled by the real cancel", res.StatusClass, res.CancellationObserved)
	}
	if rec := h.record(); rec.Outcome != schemas.OutcomeLoserCanceled {
		t.Errorf("record outcome %s, want loser_canceled: the real cancel's reason, not a forged one's", rec.Outcome)
	}
	if got := h.metric("hedgerow_worker_cancellations_total", "observed", "true"); got != 1 {
		t.Errorf("cancellations_total{observed=true} = %v, want the one real cancel", got)
	}
	if logs := h.logs.String(); strings.Contains(logs, att.Secret) || strings.Contains(logs, other) {
		t.Errorf("a secret reached the logs:\n%s", logs)
	}
}

func TestMalformedControlMessageIsCountedAndIgnored(t *testing.T) {
	h := newHarness(t, setup{fake: fakellm.Options{Model: model(t, 1, 5, 1000)}})
	if err := h.dc.Publish(h.w.ControlInbox(), []byte(`{"v":1,"group_id":`)); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, wait, "malformed control message counted", func() bool {
		return h.metric("hedgerow_worker_cancels_rejected_total", "reason", RejectMalformed) == 1
	})
}
