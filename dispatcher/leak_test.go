package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// TestNoGoroutineLeakAfterTenThousandGroups runs 10,000 groups through real
// workers and providers, a share of them hedged and cancelled, and checks that
// the number of goroutines returns to where it was once they are done.
func TestNoGoroutineLeakAfterTenThousandGroups(t *testing.T) {
	const groups, parallel = 10_000, 32
	// Every 10th request to route a stalls until cancelled, so hedges (to b,
	// which never stalls) and cancels are exercised too.
	stalling := newScript(behaviour{words: 2})
	stalling.every = 10
	stalling.everyBehaviour = behaviour{hang: true}
	ps := map[string]*provider{"a": newProvider(t, "a", stalling), "b": newProvider(t, "b", newScript(behaviour{words: 2}))}
	c := newCluster(t, []string{"a", "b"}, ps, "")

	// Failed groups' records, to tell a budget refusal from anything else.
	var failedMu sync.Mutex
	failed := map[string]schemas.GroupRecord{}
	fs, err := c.nc.Subscribe(GroupRecordSubject, func(m *nats.Msg) {
		var r schemas.GroupRecord
		if json.Unmarshal(m.Data, &r) == nil && r.Outcome != schemas.GroupCommitted {
			failedMu.Lock()
			failed[r.HedgeGroupID] = r
			failedMu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fs.Unsubscribe() }()

	run := func(n int) []error {
		var wg sync.WaitGroup
		work := make(chan struct{})
		errs := make(chan error, n)
		for range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range work {
					if _, err := c.d.Submit(context.Background(), Submission{Pool: "general", Request: chat(true)}, nil); err != nil {
						errs <- err
					}
				}
			}()
		}
		for range n {
			work <- struct{}{}
		}
		close(work)
		wg.Wait()
		close(errs)
		var out []error
		for err := range errs {
			out = append(out, err)
		}
		return out
	}
	settle := func() int {
		c.d.groups.Wait() // every group, late losers included, has ended
		if err := c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		return runtime.NumGoroutine()
	}

	// Warm up so the keep-alive connections a steady load holds are open
	// before counting.
	run(4 * parallel)
	before := settle()
	errs := run(groups)
	if err := c.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Under the race detector on two cores many primaries miss the 100ms
	// delay and the duplicate-rate bucket refuses some hedges; a stalled
	// primary whose hedge was refused then fails at its deadline. That is
	// the budget working, not a leak, so a few may fail, for that reason only.
	for _, err := range errs {
		var ge *GroupError
		if !errors.As(err, &ge) || ge.Code != schemas.ErrDeadlineExceeded {
			t.Fatalf("a group failed: %v", err)
		}
		failedMu.Lock()
		rec, ok := failed[ge.Group]
		failedMu.Unlock()
		if ok && rec.HedgeSuppressedReason != string(budgets.ReasonDuplicateRate) {
			t.Fatalf("group %s missed its deadline for another reason: %+v", ge.Group, rec)
		}
	}
	if len(errs) > groups/100 {
		t.Fatalf("%d of %d groups failed", len(errs), groups)
	}
	after := settle()
	// Idle keep-alive connections may differ by a few; anything kept per
	// group would be thousands.
	if after > before+10 {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("%d goroutines before, %d after 10,000 groups\n%s", before, after, buf[:n])
	}
	t.Logf("%d goroutines before and %d after 10,000 groups (%d failed at the deadline after a refused hedge)", before, after, len(errs))
}
