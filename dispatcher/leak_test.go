package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/schemas"
)

// leakPolicyYAML is policyYAML with accept and heartbeat timeouts long
// enough that a busy two-core machine running other test packages does not
// turn slow accepts into lost attempts: this test is about leaks, and every
// group should complete.
const leakPolicyYAML = `
policies:
  default:
    control_fraction: 0
    delay: {initial: 100ms, min: 10ms, warmup_samples: 1000000}
    deadline: 3s
    min_useful_time: 50ms
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 3s
    duplicate_rate: {ceiling: 1}
`

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
	c := newCluster(t, []string{"a", "b"}, ps, leakPolicyYAML)

	// Failed groups' records, to tell a budget refusal from anything else.
	var failedMu sync.Mutex
	failed := map[string]schemas.GroupRecord{}
	recorded := make(chan struct{}, 1)
	fs, err := c.nc.Subscribe(schemas.GroupRecordSubject, func(m *nats.Msg) {
		var r schemas.GroupRecord
		if json.Unmarshal(m.Data, &r) == nil && r.Outcome != schemas.GroupCommitted {
			failedMu.Lock()
			failed[r.HedgeGroupID] = r
			failedMu.Unlock()
			select {
			case recorded <- struct{}{}:
			default:
			}
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
	// Under the race detector on a busy two-core machine some primaries miss
	// the 100ms delay, the duplicate-rate bucket
	// refuses some hedges, and a few groups fail with a stable error. That is
	// the budget and the timeouts working, not a leak: a few may fail, each
	// with a GroupError, none silently.
	for _, err := range errs {
		var ge *GroupError
		if !errors.As(err, &ge) {
			t.Fatalf("a group failed without a stable error: %v", err)
		}
		rec, ok := waitRecord(failed, &failedMu, recorded, ge.Group)
		if !ok || rec.ErrorCode != ge.Code {
			t.Errorf("group %s failed with %s but its record says %+v", ge.Group, ge.Code, rec)
		}
	}
	// How many fail depends on the machine's load (a hedge the bucket
	// refuses leaves a stalled primary to its deadline): 103 of 10,000 did
	// at a load average of 7. This test is about leaks; a tenth failing
	// would still say the runtime is broken.
	if len(errs) > groups/10 {
		t.Fatalf("%d of %d groups failed", len(errs), groups)
	}
	after := settle()
	// Each idle keep-alive connection between a worker and its provider
	// holds three goroutines (client read and write loops, server conn), and
	// how many the pools keep after a burst varies by a few per parallel
	// caller; anything kept per group would be thousands.
	if after > before+3*parallel {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Fatalf("%d goroutines before, %d after 10,000 groups\n%s", before, after, buf[:n])
	}
	t.Logf("%d goroutines before and %d after 10,000 groups (%d failed with a stable error)", before, after, len(errs))
}

// waitRecord waits, bounded, for group id's record to arrive in records.
func waitRecord(records map[string]schemas.GroupRecord, mu *sync.Mutex, arrived <-chan struct{}, id string) (schemas.GroupRecord, bool) {
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for {
		mu.Lock()
		rec, ok := records[id]
		mu.Unlock()
		if ok {
			return rec, true
		}
		select {
		case <-arrived:
		case <-timeout.C:
			return schemas.GroupRecord{}, false
		}
	}
}
