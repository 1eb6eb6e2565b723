package dispatcher

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/dispatcher/delay"
	"github.com/hedgerow/hedgerow/schemas"
)

// controlPolicy makes every group a control group and hedges a primary
// without its first byte after 200 ms.
const controlPolicy = `
policies:
  default:
    control_fraction: 1
    max_attempts: 2
    delay: {initial: 200ms, min: 200ms, max: 200ms, warmup_samples: 1000000}
    deadline: 10s
    min_useful_time: 10ms
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 5s
`

// TestAControlGroupsCallerHasTheHedgesAnswerWhileItsPrimaryRunsOnAsTheBaseline:
// a control group's primary stalls (its provider holds it), and its hedge
// answers. The caller has the hedge's stream and its final answer — with
// the total usage it awaits — while the primary still runs: it is not
// cancelled at the commit. Released, the primary reaches its first token,
// unseen by the caller, and is cancelled there as the race's loser; its
// first byte is the guardrail's control sample, what the group would have
// measured had it run primary-only.
func TestAControlGroupsCallerHasTheHedgesAnswerWhileItsPrimaryRunsOnAsTheBaseline(t *testing.T) {
	hold := make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(hold)
		}
	}()
	// The primary, once released, waits 300 ms more, sends its first words
	// and then only keep-alives: it ends only when cancelled.
	const stall = 300 * time.Millisecond
	sc := newScript(behaviour{words: 2}, behaviour{hold: hold, firstByte: stall, words: 2, stall: true})
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	c := newCluster(t, []string{"a", "b"}, ps, controlPolicy)
	d, _ := singleDispatcher(t, c)

	var mu sync.Mutex
	var deltas []string
	sink := sinkFunc(func(dl Delta) error {
		mu.Lock()
		defer mu.Unlock()
		deltas = append(deltas, dl.Content)
		return nil
	})
	start := time.Now()
	resp, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true), AwaitTotalUsage: true}, sink)
	if err != nil {
		t.Fatal(err)
	}
	// The answer came while the primary is held: the caller waited for
	// neither the primary nor the group's end.
	answered := time.Since(start)
	if resp.Winner != 2 || resp.Attempts != 2 || !resp.Hedged {
		t.Fatalf("winner %d of %d attempts (hedged %v), want the hedge of 2", resp.Winner, resp.Attempts, resp.Hedged)
	}
	mu.Lock()
	for _, dl := range deltas {
		if !strings.HasPrefix(dl, resp.WinnerRoute) {
			t.Errorf("the caller got %q, not of the winner's route %s", dl, resp.WinnerRoute)
		}
	}
	mu.Unlock()
	// The answer awaiting the total usage counts the running primary at
	// its input, as a loser cancelled then would be.
	if resp.TotalUsage.InputUnits <= resp.Usage.InputUnits {
		t.Fatalf("TotalUsage %+v holds no more than the winner's %+v: the kept primary is missing", resp.TotalUsage, resp.Usage)
	}

	releasedAt := time.Since(start)
	close(hold)
	released = true
	rec := c.groupRecord(resp.GroupID)
	atts := c.attemptRecords(resp.GroupID, 2)
	if rec.Outcome != schemas.GroupCommitted || rec.WinnerAttempt != 2 || !rec.HedgeLaunched || rec.GuardrailDecision != schemas.GuardrailControl {
		t.Fatalf("group record %+v, want committed to the hedge of a control group", rec)
	}
	if p := atts[1]; p.Outcome != schemas.OutcomeLoserCanceled || p.FirstByteMs == nil || !p.CancellationSent || !p.ContractValid {
		t.Fatalf("primary record %+v: want it ran to its first token, valid, then cancelled as a loser", p)
	}
	// Its record carries the latency the group would have had primary-only:
	// the primary's first byte, counted from the group's start — so plus the
	// time its launch trailed that start, which a loaded machine makes more
	// than a millisecond but never as long as the caller's answer took (the
	// primary launched before the hedge that answered).
	if b := rec.ControlBaselineMs; b == nil {
		t.Fatal("no control_baseline_ms, want the primary's first byte")
	} else if fb := *atts[1].FirstByteMs; *b < fb || *b > fb+answered.Milliseconds() {
		t.Fatalf("control_baseline_ms %d, want the primary's first byte at %d ms plus under %v for its launch", *b, fb, answered)
	}
	if w := atts[2]; w.Outcome != schemas.OutcomeWinner {
		t.Fatalf("hedge record %+v, want the winner", w)
	}
	// The group record waits for the primary's end; the answer did not.
	if rec.ElapsedMs > answered.Milliseconds() {
		t.Fatalf("the group record's latency %d ms is past the answer's %v", rec.ElapsedMs, answered)
	}

	cl := d.classes["default"]
	cohort := delay.NewCohort(cl.Name, "general", true, chat(true).MaxTokens)
	st := cl.Guardrail.Stats(cohort, time.Now())
	if st.ControlSamples != 1 || st.HedgedSamples != 0 || st.ControlErrorRate != 0 {
		t.Fatalf("guardrail holds %d control and %d hedged samples (control error rate %v), want the one control sample",
			st.ControlSamples, st.HedgedSamples, st.ControlErrorRate)
	}
	// The sample is the primary's own first byte, which came after its
	// release and stall, not the hedge's (the caller's latency).
	firstByte := time.Duration(*atts[1].FirstByteMs) * time.Millisecond
	if math.Abs(st.ControlQuantile.Seconds()-firstByte.Seconds()) > 0.011*firstByte.Seconds()+0.002 {
		t.Fatalf("control sample %v, want the primary's first byte %v", st.ControlQuantile, firstByte)
	}
	// (Records carry whole milliseconds, cut down.)
	if firstByte < releasedAt+stall-time.Millisecond || float64(st.ControlQuantile) < 0.99*float64(releasedAt+stall) {
		t.Fatalf("control sample %v (primary first byte %v): want it after the release at %v and the stall of %v",
			st.ControlQuantile, firstByte, releasedAt, stall)
	}
}
