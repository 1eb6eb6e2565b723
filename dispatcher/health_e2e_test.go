package dispatcher

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hedgerow/hedgerow/arbiter"
	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/dispatcher/route"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// faultRequests and faultClients shape the fault scenario: a cold gateway
// (default policy, duplicate budget and outlier detection) is sent
// streaming requests by faultClients concurrent callers, at least
// faultRequests of them and then until the failing route is ejected, at
// most maxFaultRequests.
const (
	faultRequests    = 20
	maxFaultRequests = 200
	faultClients     = 4
	ejectAfter       = 1 // consecutive failures
)

// One route of three failing in a way a real upstream does — a 503 without
// Retry-After, a connection reset, an HTML page where an event stream should
// be — costs no request on a cold gateway: each primary it draws is
// replaced on a healthy route, it stops drawing primaries after its first
// failure (its success ratio makes it the riskier of every pairing,
// docs/architecture.md §5), and it is ejected (route health, outlier
// ejection). Since it draws no primary after its first failure, it would
// take the default three failures in a row only as its risk decays, a
// cycle of some 20 s each: the pool ejects here at the first, so that the
// run sees the ejection's whole path (counter, shared flag, gauge).
func TestAFailingRouteIsEjectedWithinAFewFailuresAndNoRequestFails(t *testing.T) {
	faults := []struct {
		name  string
		fault behaviour
	}{
		{"503 without Retry-After", behaviour{status: 503}},
		{"connection reset", behaviour{reset: true}},
		{"wrong content type (text/html)", behaviour{html: true}},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			healthy := newScript(behaviour{firstByte: 20 * time.Millisecond, words: 3})
			ps := map[string]*provider{
				"a":   newProvider(t, "a", healthy),
				"b":   newProvider(t, "b", healthy),
				"bad": newProvider(t, "bad", newScript(f.fault)),
			}
			// Every key the policy leaves out takes its default.
			c := newClusterWithPool(t, []string{"a", "b", "bad"}, ps,
				fmt.Sprintf("    outlier_detection: {consecutive_failures: %d}\n", ejectAfter), "policies:\n  default: {}\n")
			reg := prometheus.NewRegistry()
			gate, err := arbiter.NewLocalGate(arbiter.LocalGateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d := c.addDispatcher(Options{Store: budgets.NewMemory(nil), Gate: gate, Registerer: reg})

			var mu sync.Mutex
			var failed []error
			var next int
			var wg sync.WaitGroup
			for range faultClients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						mu.Lock()
						if next >= maxFaultRequests || next >= faultRequests && d.ejected("bad") {
							mu.Unlock()
							return
						}
						next++
						mu.Unlock()
						ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
						_, err := d.Submit(ctx, Submission{Pool: "general", Request: chat(true)}, discardSink{})
						cancel()
						if err != nil {
							mu.Lock()
							failed = append(failed, err)
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()

			reached := len(ps["bad"].arrived)
			regs := []*prometheus.Registry{reg}
			ejections := metricSum(t, regs, "hedgerow_route_ejections_total", "route", "bad")
			primaries, onBad := c.primaries(t, next)
			t.Logf("%s: %d of %d requests failed; the failing route was reached %d times, ejected %v times; it drew %d of %d primaries (%.0f%%)",
				f.name, len(failed), next, reached, ejections, onBad, primaries, 100*float64(onBad)/float64(primaries))

			if len(failed) > 0 {
				t.Errorf("%d of %d requests failed: %v", len(failed), next, failed)
			}
			if ejections < 1 {
				t.Fatalf("the failing route was never ejected (reached %d times)", reached)
			}
			// Three failures in a row eject it; the callers' requests
			// already on their way to it when it went out may fail too, and
			// each later ejection (a failed probe) costs one more.
			limit := ejectAfter + faultClients - 1 + int(ejections) - 1
			if reached > limit {
				t.Errorf("the failing route was reached %d times, more than the %d a prompt ejection allows", reached, limit)
			}
			if !d.ejected("bad") {
				t.Errorf("the failing route is not ejected after the run")
			}
			if g := gaugeValue(t, reg, "hedgerow_route_state", map[string]string{"route": "bad", "state": "ejected"}); g != 1 {
				t.Errorf("hedgerow_route_state{route=bad,state=ejected} = %v, want 1", g)
			}
		})
	}
}

// gaugeValue is the value of the gauge (or counter) name whose labels
// include labels.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n := 0
			for _, lp := range m.GetLabel() {
				if labels[lp.GetName()] == lp.GetValue() {
					n++
				}
			}
			if n == len(labels) && m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			if n == len(labels) {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no gauge %s%v", name, labels)
	return 0
}

// ejected reports whether d's picker holds route name ejected now.
func (d *Dispatcher) ejected(name string) bool {
	st, err := d.picker.Stats(name, d.now())
	return err == nil && st.State == route.Ejected
}

// discardSink takes a committed stream and drops it.
type discardSink struct{}

func (discardSink) Delta(Delta) error { return nil }

// primaries waits for the dispatcher's records of n primaries and returns
// how many there were and how many went to route "bad".
func (c *cluster) primaries(t *testing.T, n int) (total, onBad int) {
	t.Helper()
	eventually.True(t, 10*time.Second, "the primaries' attempt records", func() bool {
		for {
			select {
			case r := <-c.records:
				if r.Reporter == schemas.ReporterDispatcher && r.Role == schemas.RolePrimary {
					total++
					if r.Route == "bad" {
						onBad++
					}
				}
			default:
				return total >= n
			}
		}
	})
	return total, onBad
}
