package route

import (
	"math/rand/v2"
	"testing"
	"time"
)

func newTestHealth(t *testing.T, mod func(*HealthOptions)) *Health {
	t.Helper()
	cfg := DefaultHealthOptions()
	if mod != nil {
		mod(&cfg)
	}
	h, err := NewHealth(cfg)
	if err != nil {
		t.Fatalf("NewHealth: %v", err)
	}
	return h
}

// outcome is one attempt's end on a route, at an offset from t0.
type outcome struct {
	at     time.Duration
	failed bool
}

func TestHealthEjectsARouteOnConsecutiveFailuresOrAFailureRate(t *testing.T) {
	fail := func(at time.Duration) outcome { return outcome{at, true} }
	ok := func(at time.Duration) outcome { return outcome{at, false} }
	tests := []struct {
		name     string
		mod      func(*HealthOptions)
		outcomes []outcome
		want     string // the last outcome's verdict; every earlier one must be ""
	}{
		{"three transient failures in a row eject", nil,
			[]outcome{fail(0), fail(time.Millisecond), fail(2 * time.Millisecond)}, EjectConsecutive},
		{"two failures in a row do not", nil,
			[]outcome{fail(0), fail(time.Millisecond)}, ""},
		{"a success between failures restarts the count", nil,
			[]outcome{fail(0), fail(1), ok(2), fail(3), fail(4)}, ""},
		{"half of ten attempts in the window failed ejects", func(c *HealthOptions) { c.ConsecutiveFailures = 0 },
			[]outcome{ok(0), fail(1), ok(2), fail(3), ok(4), fail(5), ok(6), fail(7), ok(8), fail(9)}, EjectFailureRate},
		{"a failure rate below min requests does not eject", func(c *HealthOptions) { c.ConsecutiveFailures = 0 },
			[]outcome{fail(0), fail(1), fail(2), fail(3), ok(4)}, ""},
		{"failures that slid out of the window do not count", func(c *HealthOptions) { c.ConsecutiveFailures = 0 },
			[]outcome{fail(0), fail(1), fail(2), fail(3), fail(4),
				ok(20 * time.Second), ok(20*time.Second + 1), ok(20*time.Second + 2), ok(20*time.Second + 3), fail(20*time.Second + 4)}, ""},
		{"both triggers off never eject", func(c *HealthOptions) { c.ConsecutiveFailures, c.FailureRate = 0, 0 },
			[]outcome{fail(0), fail(1), fail(2), fail(3), fail(4), fail(5), fail(6), fail(7), fail(8), fail(9), fail(10)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newTestHealth(t, tt.mod)
			for i, o := range tt.outcomes {
				got := h.Observe("a", o.failed, t0.Add(o.at))
				if i < len(tt.outcomes)-1 && got != "" {
					t.Fatalf("outcome %d ejected (%s) before the last", i, got)
				}
				if i == len(tt.outcomes)-1 && got != tt.want {
					t.Fatalf("last outcome: %q, want %q", got, tt.want)
				}
			}
		})
	}
}

func TestHealthEjectionBacksOffWithRepeatedEjectionsUpToTheCap(t *testing.T) {
	h := newTestHealth(t, func(c *HealthOptions) { c.BaseEjection, c.MaxEjection = 10*time.Second, 35*time.Second })
	now := t0
	var got []time.Duration
	for range 4 {
		ttl := h.Eject("a", now)
		got = append(got, ttl)
		now = now.Add(ttl) // it comes back and fails its probe at once
	}
	want := []time.Duration{10 * time.Second, 20 * time.Second, 35 * time.Second, 35 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("ejections lasted %v, want %v", got, want)
		}
	}
	// Staying in for MaxEjection starts the backoff again from the base.
	if ttl := h.Eject("a", now.Add(35*time.Second)); ttl != 10*time.Second {
		t.Fatalf("an ejection after a long healthy stretch lasted %v, want the base 10s", ttl)
	}
}

func TestHealthIgnoresAnEjectedRouteAndProbesItBackIn(t *testing.T) {
	h := newTestHealth(t, nil)
	ttl := h.Eject("a", t0)
	for i := range 5 {
		if r := h.Observe("a", true, t0.Add(time.Duration(i)*time.Millisecond)); r != "" {
			t.Fatalf("a failure while ejected ejected again (%s)", r)
		}
	}
	back := t0.Add(ttl)
	if r := h.Observe("a", true, back); r != EjectProbe {
		t.Fatalf("the first failure after the ejection: %q, want %q", r, EjectProbe)
	}

	// A probe that succeeds returns the route to normal watch: it takes a
	// full run of failures to eject it again.
	ttl = h.Eject("a", back)
	back = back.Add(ttl)
	if r := h.Observe("a", false, back); r != "" {
		t.Fatalf("a successful probe: %q", r)
	}
	for i := 1; i <= 3; i++ {
		r := h.Observe("a", true, back.Add(time.Duration(i)*time.Millisecond))
		if want := map[bool]string{true: EjectConsecutive, false: ""}[i == 3]; r != want {
			t.Fatalf("failure %d after a successful probe: %q, want %q", i, r, want)
		}
	}

	// An ejection another replica decided is probed back in the same way.
	h.Ejected("b", t0.Add(time.Second))
	if r := h.Observe("b", true, t0); r != "" {
		t.Fatalf("a failure during another replica's ejection: %q", r)
	}
	if r := h.Observe("b", true, t0.Add(time.Second)); r != EjectProbe {
		t.Fatalf("the first failure after another replica's ejection: %q, want %q", r, EjectProbe)
	}
}

func TestHealthConfigRejectsWhatCannotRun(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*HealthOptions)
	}{
		{"negative consecutive failures", func(c *HealthOptions) { c.ConsecutiveFailures = -1 }},
		{"failure rate above one", func(c *HealthOptions) { c.FailureRate = 1.5 }},
		{"failure rate without min requests", func(c *HealthOptions) { c.MinRequests = 0 }},
		{"failure rate without a window", func(c *HealthOptions) { c.Window = 0 }},
		{"no base ejection", func(c *HealthOptions) { c.BaseEjection = 0 }},
		{"max ejection below base", func(c *HealthOptions) { c.MaxEjection = c.BaseEjection / 2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultHealthOptions()
			tt.mod(&cfg)
			if _, err := NewHealth(cfg); err == nil {
				t.Fatalf("NewHealth(%+v) accepted it", cfg)
			}
		})
	}
}

func TestPickPrimaryStopsPickingARouteThatFailsFast(t *testing.T) {
	// Two healthy routes each hold an attempt in flight; "bad" fails at
	// once, so it holds none and never reports a latency. Before its
	// failures are known it draws most primaries; after two it draws few.
	p := newTestPicker(t, plain("good1", "good2", "bad")...)
	pool := []string{"good1", "good2", "bad"}
	for _, r := range []string{"good1", "good2"} {
		mustDo(t, p.Observe(r, 100*time.Millisecond, t0))
		mustDo(t, p.ObserveOutcome(r, true, t0))
		mustDo(t, p.Acquire(r))
	}
	pick := func(rng *rand.Rand) (string, bool) { return p.PickPrimary(pool, t0, rng) }
	before := shares(t, 900, pick)["bad"]
	for range 2 {
		mustDo(t, p.ObserveOutcome("bad", false, t0))
	}
	after := shares(t, 900, pick)["bad"]
	if before < 900/2 {
		t.Fatalf("before its failures were known the failing route drew %d of 900; the test no longer shows the bias it fixes", before)
	}
	if after != 0 {
		t.Fatalf("after two fast failures the failing route still drew %d of 900 primaries", after)
	}
	st, err := p.Stats("bad", t0)
	if err != nil {
		t.Fatal(err)
	}
	if st.SuccessRatio >= 0.5 {
		t.Fatalf("success ratio of a route that failed twice: %v", st.SuccessRatio)
	}
}

func TestMayEjectNeverEjectsTheLastHealthyRouteOrPastTheMaxPercent(t *testing.T) {
	tests := []struct {
		name       string
		pool       []string
		flags      map[string]State
		route      string
		maxPercent int
		want       bool
	}{
		{"a route of three may go", []string{"a", "b", "c"}, nil, "a", 50, true},
		{"the only route of a pool never goes", []string{"a"}, nil, "a", 100, false},
		{"the last healthy route never goes", []string{"a", "b"}, map[string]State{"b": Quarantined}, "a", 100, false},
		{"a second ejection of three passes 50%", []string{"a", "b", "c"}, map[string]State{"b": Ejected}, "a", 50, false},
		{"a second ejection of three is within 70%", []string{"a", "b", "c"}, map[string]State{"b": Ejected}, "a", 70, true},
		{"one ejection is allowed under any percent", []string{"a", "b", "c"}, nil, "a", 10, true},
		{"a route already out is not ejected again", []string{"a", "b", "c"}, map[string]State{"a": Ejected}, "a", 100, false},
		{"a route outside the pool is not ejected from it", []string{"b", "c"}, nil, "a", 100, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPicker(t, plain("a", "b", "c")...)
			for r, s := range tt.flags {
				mustDo(t, p.SetState(r, s, t0.Add(time.Minute)))
			}
			if got := p.MayEject(tt.pool, tt.route, tt.maxPercent, t0); got != tt.want {
				t.Fatalf("MayEject = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPickPrimaryFallsBackOnEjectedRoutesWhenNothingElseIsLeft(t *testing.T) {
	p := newTestPicker(t, plain("a", "b")...)
	pool := []string{"a", "b"}
	mustDo(t, p.SetState("a", Ejected, t0.Add(time.Minute)))
	if got, ok := p.PickPrimary(pool, t0, seeded(1)); !ok || got != "b" {
		t.Fatalf("with b healthy picked %q, %v; want b", got, ok)
	}
	if _, ok := p.PickHedge(pool, []string{"b"}, t0, seeded(1), false); ok {
		t.Fatal("a hedge went to an ejected route")
	}
	mustDo(t, p.SetState("b", Quarantined, t0.Add(time.Minute)))
	if got, ok := p.PickPrimary(pool, t0, seeded(1)); !ok || got != "a" {
		t.Fatalf("with only an ejected route left picked %q, %v; want a (panic mode)", got, ok)
	}
	mustDo(t, p.SetState("a", Pushback, t0.Add(time.Minute)))
	if got, ok := p.PickPrimary(pool, t0, seeded(1)); ok {
		t.Fatalf("with no route merely ejected picked %q", got)
	}
}
