package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/schemas"
	"github.com/hedgerow/hedgerow/worker/upstream"
)

// livenessYAML is a policy with the default 30 s deadline and a hedge delay
// past anything the tests wait for, so what ends or replaces a silent
// attempt is the heartbeat timeout alone (docs/architecture.md §4 rule 4).
const livenessYAML = `
policies:
  patient:
    control_fraction: 0
    delay: {initial: 10s, min: 10ms, warmup_samples: 1000000}
    deadline: 30s
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
    stall_after_first_token: 400ms
`

const (
	livenessHeartbeatTimeout = 300 * time.Millisecond
	livenessStallBound       = 400 * time.Millisecond // the policy's, which the worker applies
)

// silentMidStream plays a worker killed mid-answer: it accepts, beats,
// sends its first byte and tokens chunks, then nothing more. silent
// receives the moment it went quiet; the handler returns once the
// dispatcher cancels the attempt (or after a bound, for a failing test).
func silentMidStream(fw *fakeWorker, a schemas.Attempt, tokens int, silent chan<- time.Time) {
	fw.accept(a)
	fw.send(a, schemas.Heartbeat{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1})
	fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
	for i := 1; i <= tokens; i++ {
		fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: int64(i), Delta: "t ", Tokens: 1, CumulativeTokens: int64(i), First: i == 1})
	}
	if err := fw.nc.Flush(); err != nil {
		fw.t.Error(err)
	}
	silent <- time.Now()
	select {
	case <-fw.cancels:
	case <-time.After(10 * time.Second):
	}
}

// A committed stream whose worker goes silent after ten tokens ends with an
// error at the heartbeat timeout, not at the 30 s deadline, and the silent
// attempt is cancelled (§4 rule 3, rule 4).
func TestACommittedStreamWhoseWorkerGoesSilentEndsWithAnErrorWithinTheHeartbeatTimeout(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil, livenessYAML)
	silent := make(chan time.Time, 1)
	startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
		silentMidStream(fw, a, 10, silent)
	})
	var (
		mu       sync.Mutex
		streamed strings.Builder
	)
	sink := sinkFunc(func(d Delta) error {
		mu.Lock()
		defer mu.Unlock()
		streamed.WriteString(d.Content)
		return nil
	})
	_, err := c.d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: chat(true)}, sink)
	ended := time.Now()
	var ge *GroupError
	if !errors.As(err, &ge) || ge.Code != schemas.ErrStreamInterrupted || !ge.Streamed {
		t.Fatalf("Submit error %v, want a streamed stream_interrupted (the lost winner), not %s", err, schemas.ErrDeadlineExceeded)
	}
	quiet := <-silent
	took := ended.Sub(quiet)
	t.Logf("silence to the caller's error: %v (heartbeat timeout %v)", took, livenessHeartbeatTimeout)
	if took > livenessHeartbeatTimeout+time.Second {
		t.Fatalf("the caller's stream ended %v after the silence, want within the heartbeat timeout %v + 1s", took, livenessHeartbeatTimeout)
	}
	mu.Lock()
	if got := strings.Count(streamed.String(), "t "); got != 10 {
		t.Errorf("caller got %d tokens, want the 10 sent before the silence", got)
	}
	mu.Unlock()
	rec := c.attemptRecords(ge.Group, 1)[1]
	if rec.Outcome != schemas.OutcomeWinner || rec.StatusClass != schemas.StatusLost || rec.ErrorScope != schemas.ScopeTransient || !rec.CancellationSent {
		t.Fatalf("attempt record %+v, want the winner lost (transient) and cancelled", rec)
	}
	// The commit was never delivered whole: the group gave its claim back
	// and records itself failed (docs/architecture.md §6).
	if g := c.groupRecord(ge.Group); g.Outcome != schemas.GroupFailed || g.ErrorCode != schemas.ErrStreamInterrupted {
		t.Fatalf("group record %+v, want failed stream_interrupted (the lost winner), not the deadline", g)
	}
}

// An attempt that goes silent after its first byte, before its commit
// point (a non-streaming caller commits the complete answer), is lost at
// the heartbeat timeout and replaced; the replacement's answer wins long
// before the deadline.
func TestAnAttemptSilentAfterItsFirstByteIsReplacedBeforeCommit(t *testing.T) {
	c := newCluster(t, []string{"a", "b"}, nil, livenessYAML)
	silent := make(chan time.Time, 1)
	startFakeWorker(t, c, []string{"a", "b"}, func(fw *fakeWorker, a schemas.Attempt) {
		if a.Attempt == 1 {
			silentMidStream(fw, a, 0, silent)
			return
		}
		fw.answer(a, "replacement answer")
	})
	resp, err := c.d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: chat(false)}, nil)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	took := time.Since(<-silent)
	t.Logf("silence to the replacement's answer: %v (heartbeat timeout %v)", took, livenessHeartbeatTimeout)
	if resp.Winner != 2 || resp.Hedged || resp.Content != "replacement answer" {
		t.Fatalf("response %+v, want the replacement (attempt 2) to win", resp)
	}
	if took > livenessHeartbeatTimeout+time.Second {
		t.Fatalf("answered %v after the silence, want within the heartbeat timeout %v + 1s", took, livenessHeartbeatTimeout)
	}
	recs := c.attemptRecords(resp.GroupID, 2)
	if recs[1].Outcome != schemas.OutcomeFailed || recs[1].StatusClass != schemas.StatusLost || recs[1].ErrorScope != schemas.ScopeTransient {
		t.Fatalf("attempt 1 record %+v, want failed lost transient", recs[1])
	}
}

// A provider that goes silent after its first token (keep-alives only) is
// cut by the worker at the policy's stall bound (stall_after_first_token,
// carried in the Attempt; the worker's own default is 2 s) as a transient
// failure; before the commit point a replacement launches and its answer
// wins, long before the 30 s deadline (§4 rule 4).
func TestAProviderStallingAfterItsFirstTokenIsReplacedBeforeCommit(t *testing.T) {
	sc := newScript(behaviour{words: 3}, behaviour{words: 1, stall: true})
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	c := newCluster(t, []string{"a", "b"}, ps, livenessYAML)
	start := time.Now()
	resp, err := c.d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: chat(false)}, nil)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	took := time.Since(start)
	t.Logf("answered after %v (the policy's stall bound %v)", took, livenessStallBound)
	if resp.Winner != 2 || resp.Hedged {
		t.Fatalf("response %+v, want the replacement (attempt 2) to win", resp)
	}
	// Below the worker's own default bound: the policy's was applied.
	if took > livenessStallBound+time.Second || took >= upstream.DefaultStallAfterFirstToken {
		t.Fatalf("answered after %v, want within the policy's stall bound %v + 1s", took, livenessStallBound)
	}
	recs := c.attemptRecords(resp.GroupID, 2)
	if recs[1].Outcome != schemas.OutcomeFailed || recs[1].StatusClass != schemas.StatusServerError || recs[1].ErrorScope != schemas.ScopeTransient {
		t.Fatalf("attempt 1 record %+v, want failed server_error transient (the stall)", recs[1])
	}
	waitGone(t, ps[recs[1].Route]) // the worker cut the stalled request
}

// derivedStallYAML caps the stall bound at 10 s, far above anything the
// test waits for, with a 100 ms floor: once the cohort has samples, its
// derived bound is what cuts a stalled stream.
const derivedStallYAML = `
policies:
  patient:
    control_fraction: 0
    delay: {initial: 10s, min: 10ms, warmup_samples: 1000000}
    deadline: 30s
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 5s
    stall_after_first_token: 10s
    stall_floor: 100ms
`

// The stall bound after the first token is derived from the cohort's
// inter-token gaps (§4 rule 4): the first attempts carry the policy's cap;
// after 50 successful attempts whose tokens came back to back (gaps of a
// millisecond or less, 4 × which is under the floor) the next Attempt
// carries the floor, the gauge says so, and a provider that then stalls
// after its first token is cut at that bound and replaced before the
// commit, long before the 10 s cap.
func TestAfterFiftyQuickStreamsTheCohortsDerivedStallBoundCutsAStall(t *testing.T) {
	const (
		warm     = 50
		stallCap = 10 * time.Second
		floor    = 100 * time.Millisecond
	)
	next := make([]behaviour, 0, warm+1)
	for range warm {
		next = append(next, behaviour{words: 3})
	}
	next = append(next, behaviour{words: 1, stall: true})
	sc := newScript(behaviour{words: 3}, next...)
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	c := newCluster(t, []string{"a", "b"}, ps, derivedStallYAML)
	d, regs := singleDispatcher(t, c)
	attempts, err := c.nc.SubscribeSync(schemas.AttemptSubjectPrefix + ">")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = attempts.Unsubscribe() })
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nextAttempt := func() schemas.Attempt {
		t.Helper()
		msg, err := attempts.NextMsg(10 * time.Second)
		if err != nil {
			t.Fatalf("no attempt published: %v", err)
		}
		var a schemas.Attempt
		if err := json.Unmarshal(msg.Data, &a); err != nil {
			t.Fatal(err)
		}
		return a
	}
	req := chat(false)
	cohort := delay.NewCohort("patient", "general", false, req.MaxTokens).Key()
	bound := func() time.Duration {
		return time.Duration(gaugeValue(t, regs[0], "hedgerow_stall_bound_seconds", map[string]string{"cohort": cohort}) * float64(time.Second))
	}
	if got := bound(); got != stallCap {
		t.Fatalf("a cold cohort's stall bound %v, want the cap %v", got, stallCap)
	}
	for i := range warm {
		if _, err := d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: req}, nil); err != nil {
			t.Fatalf("warm-up request %d: %v", i, err)
		}
		if a := nextAttempt(); a.StallAfterFirstTokenMs != stallCap.Milliseconds() {
			t.Fatalf("attempt of warm-up request %d carries a stall bound of %d ms, want the cap %v until %d samples", i, a.StallAfterFirstTokenMs, stallCap, warm)
		}
	}
	if got := bound(); got != floor {
		t.Fatalf("after %d quick streams the stall bound is %v, want the floor %v", warm, got, floor)
	}
	start := time.Now()
	resp, err := d.Submit(context.Background(), Submission{Operation: "patient", Pool: "general", Request: req}, nil)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	took := time.Since(start)
	t.Logf("answered after %v (derived stall bound %v, cap %v)", took, floor, stallCap)
	for n := 1; n <= 2; n++ {
		if a := nextAttempt(); a.Attempt != n || a.StallAfterFirstTokenMs != floor.Milliseconds() {
			t.Fatalf("attempt %d carries a stall bound of %d ms, want attempt %d with the derived %v", a.Attempt, a.StallAfterFirstTokenMs, n, floor)
		}
	}
	if resp.Winner != 2 || resp.Hedged {
		t.Fatalf("response %+v, want the replacement (attempt 2) to win", resp)
	}
	if took >= stallCap/2 {
		t.Fatalf("answered after %v: the stall was not cut at the derived bound %v (cap %v)", took, floor, stallCap)
	}
	recs := c.attemptRecords(resp.GroupID, 2)
	if recs[1].Outcome != schemas.OutcomeFailed || recs[1].StatusClass != schemas.StatusServerError || recs[1].ErrorScope != schemas.ScopeTransient {
		t.Fatalf("attempt 1 record %+v, want failed server_error transient (the stall)", recs[1])
	}
	waitGone(t, ps[recs[1].Route]) // the worker cut the stalled request
}
