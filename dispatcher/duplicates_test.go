package dispatcher

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/schemas"
)

// singleDispatcher adds a dispatcher of its own to c, on a fresh memory
// store, with a registry the test reads.
func singleDispatcher(t *testing.T, c *cluster) (*Dispatcher, []*prometheus.Registry) {
	t.Helper()
	gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	return c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg}), []*prometheus.Registry{reg}
}

// coldReplacementPolicy is the default duplicate ceiling with no floor and
// no hedges: on a cold gateway the window holds too few primaries to allow
// a single extra attempt, so only the rule that replacements are never
// refused by the ceiling lets a failed primary be replaced.
const coldReplacementPolicy = `
policies:
  default:
    hedge: false
    control_fraction: 0
    max_attempts: 2
    deadline: 10s
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 3s
    duplicate_rate: {ceiling: 0.08, window: 10s, reserve: {burst: 0}}
`

// TestReplacementAfterAFastFailureIsNeverRefusedByTheDuplicateCeiling: on
// a cold gateway the first request a route gets answers 503 at once —
// whichever route the first primary goes to, so the test does not hang on
// the picker's draw. That primary is replaced on a healthy route, although
// the cohort's window could not pay for one extra attempt: no request fails.
func TestReplacementAfterAFastFailureIsNeverRefusedByTheDuplicateCeiling(t *testing.T) {
	firstFails := newScript(behaviour{words: 2}, behaviour{status: http.StatusServiceUnavailable})
	ps := map[string]*provider{
		"one":   newProvider(t, "one", firstFails),
		"two":   newProvider(t, "two", firstFails),
		"three": newProvider(t, "three", firstFails),
	}
	c := newCluster(t, []string{"one", "two", "three"}, ps, coldReplacementPolicy)
	d, regs := singleDispatcher(t, c)
	const requests = 12 // 12 × 0.08 < 1: the window never pays for an extra attempt
	for i := range requests {
		if _, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil); err != nil {
			t.Fatalf("request %d of %d failed: %v", i+1, requests, err)
		}
	}
	replacements := metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RoleReplacement))
	refused := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", string(budgets.ReasonDuplicateRate))
	if replacements == 0 {
		t.Fatalf("the failed first primary of %d requests was not replaced", requests)
	}
	if refused != 0 {
		t.Fatalf("%v extra attempts refused by the duplicate ceiling, want 0 (%v replacements went)", refused, replacements)
	}
}

// burstPolicy hedges a primary without its first byte after 1 s under the
// default ceiling over a window long enough that a loaded machine sends the
// whole test within it, with no floor and no reserve, so the window alone
// decides.
const burstPolicy = `
policies:
  default:
    control_fraction: 0
    max_attempts: 2
    delay: {initial: 1s, min: 1s, max: 1s, warmup_samples: 1000000}
    deadline: 20s
    min_useful_time: 10ms
    accept_timeout: 2s
    heartbeat_interval: 50ms
    heartbeat_timeout: 5s
    duplicate_rate: {ceiling: 0.08, window: 60s, replacement_reserve: 0, reserve: {burst: 0}}
`

// TestBurstOfStallsAtASteadyRateIsHedgedWithinTheWindowCeiling: 100 quick
// requests, then 9 at once whose primaries stall. The window holds 109
// primaries, so 8.72 extra attempts at 8%: eight stalls are hedged at once
// (a bucket of 8 tokens keeping 3 for replacements hedged 5), the ninth is
// refused by the ceiling, and the window's hedges stay within it.
func TestBurstOfStallsAtASteadyRateIsHedgedWithinTheWindowCeiling(t *testing.T) {
	const steady, burst, wantHedged = 100, 9, 8
	next := make([]behaviour, 0, steady+burst)
	for range steady {
		next = append(next, behaviour{words: 2})
	}
	for range burst {
		next = append(next, behaviour{firstByte: 4 * time.Second, words: 2})
	}
	sc := newScript(behaviour{words: 2}, next...)
	ps := map[string]*provider{"a": newProvider(t, "a", sc), "b": newProvider(t, "b", sc)}
	c := newCluster(t, []string{"a", "b"}, ps, burstPolicy)
	d, regs := singleDispatcher(t, c)
	for i := range steady {
		if _, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil); err != nil {
			t.Fatalf("steady request %d: %v", i+1, err)
		}
	}
	if h := metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RoleHedge)); h != 0 {
		t.Fatalf("%v hedges among the quick requests: the window is not what the test assumes", h)
	}
	var wg sync.WaitGroup
	errs := make(chan error, burst)
	for range burst {
		wg.Go(func() {
			if _, err := d.Submit(context.Background(), Submission{Pool: "general", Request: chat(false)}, nil); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("burst request: %v", err)
	}
	hedges := metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RoleHedge))
	refused := metricSum(t, regs, "hedgerow_hedges_suppressed_total", "reason", string(budgets.ReasonDuplicateRate))
	primaries := metricSum(t, regs, "hedgerow_attempts_total", "role", string(schemas.RolePrimary))
	if hedges != wantHedged || refused != burst-wantHedged {
		t.Fatalf("%v of %d stalls hedged and %v refused by the ceiling, want %d and %d", hedges, burst, refused, wantHedged, burst-wantHedged)
	}
	if hedges > 0.08*primaries {
		t.Fatalf("%v hedges for %v primaries: above the 8%% ceiling", hedges, primaries)
	}
}
