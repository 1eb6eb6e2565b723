package tenantlimit

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counter reads one counter series the registry holds: name, then label
// pairs.
func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
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
					found = found || lp.GetName() == labels[i] && lp.GetValue() == labels[i+1]
				}
				if !found {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no series %s %v", name, labels)
	return 0
}

func newLimiter(t *testing.T, clock *slicetest.Clock, limits map[string]Limit, reg prometheus.Registerer) *Limiter {
	t.Helper()
	l, err := New(slicetest.Slices(t, slice.NewMemory(clock.Now), clock.Now), Options{Limits: limits, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func refusal(t *testing.T, err error) *Refusal {
	t.Helper()
	r, ok := errors.AsType[*Refusal](err)
	if !ok {
		t.Fatalf("Admit = %v; want a *Refusal", err)
	}
	return r
}

func TestATenantWithoutLimitsIsAlwaysAdmitted(t *testing.T) {
	l := newLimiter(t, slicetest.NewClock(), map[string]Limit{"acme": {RequestsPerSecond: 1, Burst: 1}, "free": {}}, nil)
	for _, tenant := range []string{"", "free", "unknown"} {
		for range 5 {
			release, err := l.Admit(context.Background(), tenant)
			if err != nil {
				t.Fatalf("tenant %q refused: %v", tenant, err)
			}
			release()
		}
	}
}

func TestRateLimitAdmitsTheBurstThenRefusesUntilATokenRefills(t *testing.T) {
	clock := slicetest.NewClock()
	reg := prometheus.NewRegistry()
	l := newLimiter(t, clock, map[string]Limit{"acme": {RequestsPerSecond: 0.5, Burst: 3}}, reg)
	ctx := context.Background()
	for i := range 3 {
		if _, err := l.Admit(ctx, "acme"); err != nil {
			t.Fatalf("request %d of a burst of 3 refused: %v", i+1, err)
		}
	}
	_, err := l.Admit(ctx, "acme")
	if r := refusal(t, err); r.Reason != ReasonRate || r.RetryAfter != 2*time.Second {
		t.Fatalf("4th request refused %+v; want reason rate, retry after 2s (one token at 0.5/s)", r)
	}
	clock.Advance(2 * time.Second)
	if _, err := l.Admit(ctx, "acme"); err != nil {
		t.Fatalf("request after the refill refused: %v", err)
	}
	if got := counter(t, reg, "hedgerow_tenant_limit_refusals_total", "reason", "rate"); got != 1 {
		t.Fatalf("rate refusals counted %v; want 1", got)
	}
}

func TestBurstDefaultsToTheRateRoundedUp(t *testing.T) {
	l := newLimiter(t, slicetest.NewClock(), map[string]Limit{"acme": {RequestsPerSecond: 2.5}}, nil)
	admitted := 0
	for range 10 {
		if _, err := l.Admit(context.Background(), "acme"); err == nil {
			admitted++
		}
	}
	if admitted != 3 {
		t.Fatalf("%d admitted at once; want 3 (2.5/s rounded up)", admitted)
	}
}

func TestConcurrencyLimitRefusesTheNextUntilOneIsReleased(t *testing.T) {
	l := newLimiter(t, slicetest.NewClock(), map[string]Limit{"acme": {MaxConcurrent: 2}}, nil)
	ctx := context.Background()
	first, err := l.Admit(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	second, err := l.Admit(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Admit(ctx, "acme")
	if r := refusal(t, err); r.Reason != ReasonConcurrency || r.RetryAfter != ConcurrencyRetryAfter {
		t.Fatalf("3rd request refused %+v; want reason concurrency, retry after %v", r, ConcurrencyRetryAfter)
	}
	first()
	first() // a second release frees nothing more
	third, err := l.Admit(ctx, "acme")
	if err != nil {
		t.Fatalf("request after a release refused: %v", err)
	}
	if _, err := l.Admit(ctx, "acme"); err == nil {
		t.Fatal("a double release freed two slots")
	}
	second()
	third()
}

// A request the rate refuses holds no concurrency slot afterwards.
func TestARateRefusalFreesTheSlotItTook(t *testing.T) {
	clock := slicetest.NewClock()
	l := newLimiter(t, clock, map[string]Limit{"acme": {RequestsPerSecond: 1, Burst: 1, MaxConcurrent: 1}}, nil)
	ctx := context.Background()
	release, err := l.Admit(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	release()
	if _, err := l.Admit(ctx, "acme"); refusal(t, err).Reason != ReasonRate {
		t.Fatalf("second request: %v; want a rate refusal", err)
	}
	clock.Advance(time.Second)
	if _, err := l.Admit(ctx, "acme"); err != nil {
		t.Fatalf("after the refill: %v (the rate refusal kept its slot)", err)
	}
}

// downGranter is a granter that stops answering when down is set, as a
// Redis that went away.
type downGranter struct {
	slice.Granter
	down atomic.Bool
}

var errDown = errors.New("down")

func (g *downGranter) Take(ctx context.Context, r slice.Rate, holder string, want, adjust float64) (float64, float64, time.Duration, error) {
	if g.down.Load() {
		return 0, 0, 0, errDown
	}
	return g.Granter.Take(ctx, r, holder, want, adjust)
}

func (g *downGranter) Hold(ctx context.Context, c slice.Concurrency, holder string, want int, ttl time.Duration) (int, error) {
	if g.down.Load() {
		return 0, errDown
	}
	return g.Granter.Hold(ctx, c, holder, want, ttl)
}

// Without its granter, a gateway still limits its tenants — at its safe
// share (here the whole ceiling: it saw no other gateway alive) — where
// the limits once failed open.
func TestAGatewayWithoutItsGranterStillLimitsItsTenants(t *testing.T) {
	clock := slicetest.NewClock()
	granter := &downGranter{Granter: slice.NewMemory(clock.Now)}
	reg := prometheus.NewRegistry()
	l, err := New(slicetest.Slices(t, granter, clock.Now), Options{Limits: map[string]Limit{"acme": {RequestsPerSecond: 1, Burst: 2, MaxConcurrent: 1}}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	release, err := l.Admit(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	granter.down.Store(true)
	if _, err := l.Admit(ctx, "acme"); refusal(t, err).Reason != ReasonConcurrency {
		t.Fatalf("a second request in flight without the granter: %v; want a concurrency refusal", err)
	}
	release()
	admitted := 0
	for range 10 {
		if release, err := l.Admit(ctx, "acme"); err == nil {
			admitted++
			release()
		}
	}
	// The slice's second token, then the safe share's burst of 2.
	if admitted > 3 {
		t.Fatalf("%d of 10 requests admitted at once without the granter; the slice and the safe share allow 3", admitted)
	}
	if got := counter(t, reg, "hedgerow_tenant_limit_refusals_total", "reason", "rate"); got == 0 {
		t.Fatal("no rate refusal counted without the granter")
	}
}

func TestNewRefusesWhatItCannotApply(t *testing.T) {
	slices := slicetest.Slices(t, slice.NewMemory(nil), time.Now)
	for name, opts := range map[string]Options{
		"a negative limit":    {Limits: map[string]Limit{"a": {MaxConcurrent: -1}}},
		"a negative rate":     {Limits: map[string]Limit{"a": {RequestsPerSecond: -1}}},
		"a rate not a number": {Limits: map[string]Limit{"a": {RequestsPerSecond: math.NaN()}}},
		"a negative burst":    {Limits: map[string]Limit{"a": {RequestsPerSecond: 1, Burst: -1}}},
	} {
		if _, err := New(slices, opts); err == nil {
			t.Errorf("%s was accepted", name)
		}
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("nil slices were accepted")
	}
}

// BenchmarkAdmitAndRelease is the cost a limited request pays in one
// gateway: a slot, a token and the release, from its slices in memory.
func BenchmarkAdmitAndRelease(b *testing.B) {
	l, err := New(slicetest.Slices(b, slice.NewMemory(nil), time.Now), Options{Limits: map[string]Limit{"acme": {RequestsPerSecond: 1e12, Burst: 1 << 30, MaxConcurrent: 1 << 20}}})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		release, err := l.Admit(ctx, "acme")
		if err != nil {
			b.Fatal(err)
		}
		release()
	}
}
