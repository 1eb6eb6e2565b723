package dispatcher

// Retries after a death (docs/architecture.md §2, §7): the attempts a dead
// worker or a dead gateway's group spent do not exhaust the retry's
// attempt ledger. Every policy here has max_attempts 1, so the dead
// group's one attempt is the user action's whole allowance: before
// forgiveness every retry here was refused 429 budget_exhausted with
// X-Should-Retry: false.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hedgerow/hedgerow/schemas"
)

// dyingPolicy allows one attempt per user action; a worker silent for
// 300 ms is taken for dead.
const dyingPolicy = `
policies:
  default:
    hedge: false
    control_fraction: 0
    max_attempts: 1
    deadline: 3s
    min_useful_time: 50ms
    accept_timeout: 250ms
    heartbeat_interval: 50ms
    heartbeat_timeout: 300ms
    duplicate_rate: {ceiling: 1}
`

// firstTryDies is a fake worker whose first attempt of each user action
// dies after accepting it — before its first byte, or after one streamed
// chunk — and which answers every later attempt.
func firstTryDies(t *testing.T, c *cluster, afterChunk bool) {
	var seen sync.Map // user action → tried
	startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
		if _, tried := seen.LoadOrStore(a.UserActionID, true); tried {
			fw.answer(a, "the retry's answer")
			return
		}
		fw.accept(a)
		if afterChunk {
			fw.send(a, schemas.FirstByte{GroupID: a.GroupID, Attempt: a.Attempt})
			fw.send(a, schemas.Chunk{GroupID: a.GroupID, Attempt: a.Attempt, Seq: 1, Delta: "half ", Tokens: 1, CumulativeTokens: 1, First: true})
		}
		// Then silence: no heartbeat, no result, as from a killed process.
	})
}

func TestRetryAfterAWorkerDiedIsAnsweredNotRefusedBudgetExhausted(t *testing.T) {
	for _, tc := range []struct {
		name       string
		afterChunk bool
		firstCode  schemas.ErrorCode
	}{
		{"died before its first byte", false, schemas.ErrAllRoutesFailed},
		{"died mid-stream after its commit", true, schemas.ErrStreamInterrupted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, []string{"a"}, nil, dyingPolicy)
			firstTryDies(t, c, tc.afterChunk)
			const actions = 6
			var slowest time.Duration
			for i := range actions {
				sub := Submission{Pool: "general", Request: chat(tc.afterChunk), IdempotencyKey: fmt.Sprintf("worker-death-%d", i)}
				_, err := c.d.Submit(context.Background(), sub, nil)
				if ge, ok := errors.AsType[*GroupError](err); !ok || ge.Code != tc.firstCode {
					t.Fatalf("action %d, the first try: %v; want %s (its worker died)", i, err, tc.firstCode)
				}
				start := time.Now()
				resp, err := c.d.Submit(context.Background(), sub, nil)
				if err != nil || resp.Content != "the retry's answer" {
					t.Fatalf("action %d, the retry: %+v, %v; want answered, not budget_exhausted", i, resp, err)
				}
				slowest = max(slowest, time.Since(start))
			}
			t.Logf("%d of %d retries after a worker's death answered; slowest %v", actions, actions, slowest.Round(time.Millisecond))
		})
	}
}

// A retry that takes over a dead gateway's request (Submission.Supersedes,
// as the door sets it once the dead gateway's lease lapsed) is admitted
// with the dead group's slots forgiven — here its group still holds its
// one slot, live and accepted, as a killed gateway's group would — while a
// retry that takes nothing over is told when to retry, never not to.
func TestTakeoverOfADeadGatewaysGroupIsAdmittedWithItsSlotsForgiven(t *testing.T) {
	c := newCluster(t, []string{"a"}, nil, dyingPolicy)
	held := make(chan struct{})
	var once sync.Once
	startFakeWorker(t, c, []string{"a"}, func(fw *fakeWorker, a schemas.Attempt) {
		first := false
		once.Do(func() { first = true })
		if !first {
			fw.answer(a, "the takeover's answer")
			return
		}
		fw.accept(a) // the dead gateway's attempt: accepted, never answered
		close(held)
	})
	deadCtx, killDead := context.WithCancel(context.Background())
	defer killDead()
	dead := Submission{Pool: "general", Request: chat(true), IdempotencyKey: "gateway-death", GroupID: c.d.NewGroupID()}
	deadDone := make(chan error, 1)
	go func() {
		_, err := c.d.Submit(deadCtx, dead, nil)
		deadDone <- err
	}()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the dead gateway's attempt never reached the worker")
	}

	plain := dead
	plain.GroupID = ""
	_, err := c.d.Submit(context.Background(), plain, nil)
	ge, ok := errors.AsType[*GroupError](err)
	if !ok || ge.Code != schemas.ErrBudgetExhausted || ge.RetryAfter <= 0 {
		t.Fatalf("a retry that takes nothing over: %v; want budget_exhausted with a RetryAfter (a live attempt holds the ledger)", err)
	}
	t.Logf("a retry that takes nothing over: budget_exhausted, retry after %v", ge.RetryAfter.Round(time.Millisecond))

	takeover := dead
	takeover.GroupID, takeover.Supersedes = "", dead.GroupID
	start := time.Now()
	resp, err := c.d.Submit(context.Background(), takeover, nil)
	if err != nil || resp.Content != "the takeover's answer" {
		t.Fatalf("the takeover: %+v, %v; want answered with the dead group's slot forgiven", resp, err)
	}
	t.Logf("the takeover answered in %v", time.Since(start).Round(time.Millisecond))
	killDead()
	<-deadDone
}
