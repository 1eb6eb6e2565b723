package tenantlimit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

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

// fakeClock is a clock the tests advance.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time          { return c.now }
func (c *fakeClock) Advance(d time.Duration) { c.now = c.now.Add(d) }

func newLimiter(t *testing.T, store Store, limits map[string]Limit, reg prometheus.Registerer) *Limiter {
	t.Helper()
	l, err := New(store, Options{Limits: limits, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
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
	l := newLimiter(t, NewMemory(nil), map[string]Limit{"acme": {RequestsPerSecond: 1, Burst: 1}, "free": {}}, nil)
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
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	reg := prometheus.NewRegistry()
	l := newLimiter(t, NewMemory(clock.Now), map[string]Limit{"acme": {RequestsPerSecond: 0.5, Burst: 3}}, reg)
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
	l := newLimiter(t, NewMemory(func() time.Time { return time.Unix(1e9, 0) }), map[string]Limit{"acme": {RequestsPerSecond: 2.5}}, nil)
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
	l := newLimiter(t, NewMemory(nil), map[string]Limit{"acme": {MaxConcurrent: 2}}, nil)
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
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	l := newLimiter(t, NewMemory(clock.Now), map[string]Limit{"acme": {RequestsPerSecond: 1, Burst: 1, MaxConcurrent: 1}}, nil)
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

// The Limiter refreshes a running request's lease, so it outlives its TTL;
// a lease whose holder stopped refreshing it expires.
func TestLiveLeasesAreRefreshedAndDeadOnesExpire(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1e9, 0)}
	store := NewMemory(clock.Now)
	l := newLimiter(t, store, map[string]Limit{"acme": {MaxConcurrent: 1}}, nil)
	ctx := context.Background()
	release, err := l.Admit(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		clock.Advance(DefaultLeaseTTL / 2)
		l.refresh(ctx)
	}
	if _, err := l.Admit(ctx, "acme"); err == nil {
		t.Fatal("a refreshed lease lost its slot after twice its TTL")
	}
	release()
	// A gateway that died holding a slot: another limiter on the same
	// store (another replica) gets it once the lease's TTL passes.
	dead := newLimiter(t, store, map[string]Limit{"acme": {MaxConcurrent: 1}}, nil)
	if _, err := dead.Admit(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	dead.Close() // no more refreshes
	clock.Advance(DefaultLeaseTTL)
	if _, err := l.Admit(ctx, "acme"); err != nil {
		t.Fatalf("the slot of a dead holder was not freed after its TTL: %v", err)
	}
}

// failingStore fails every call.
type failingStore struct{}

var errDown = errors.New("down")

func (failingStore) Take(context.Context, string, float64, int) (bool, time.Duration, error) {
	return false, 0, errDown
}
func (failingStore) Acquire(context.Context, string, string, int, time.Duration) (bool, error) {
	return false, errDown
}
func (failingStore) Refresh(context.Context, string, string, time.Duration) (bool, error) {
	return false, errDown
}
func (failingStore) Release(context.Context, string, string) error { return errDown }

func TestAFailingStoreAdmitsAndIsCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	l := newLimiter(t, failingStore{}, map[string]Limit{"acme": {RequestsPerSecond: 1, Burst: 1, MaxConcurrent: 1}}, reg)
	for range 3 {
		release, err := l.Admit(context.Background(), "acme")
		if err != nil {
			t.Fatalf("refused on a failing store: %v", err)
		}
		release()
	}
	if got := counter(t, reg, "hedgerow_tenant_limit_store_errors_total"); got != 6 {
		t.Fatalf("store errors counted %v; want 6 (an acquire and a take per request)", got)
	}
}

func TestNewRefusesWhatItCannotApply(t *testing.T) {
	for name, opts := range map[string]Options{
		"a negative limit":         {Limits: map[string]Limit{"a": {MaxConcurrent: -1}}},
		"a negative rate":          {Limits: map[string]Limit{"a": {RequestsPerSecond: -1}}},
		"a negative lease TTL":     {LeaseTTL: -time.Second},
		"a lease TTL too short":    {LeaseTTL: time.Millisecond},
		"a negative store timeout": {StoreTimeout: -time.Second},
	} {
		if l, err := New(NewMemory(nil), opts); err == nil {
			l.Close()
			t.Errorf("%s was accepted", name)
		}
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Error("a nil store was accepted")
	}
}

// BenchmarkAdmitAndRelease is the cost a limited request pays in one
// gateway: a slot, a token and the release, on the memory store.
func BenchmarkAdmitAndRelease(b *testing.B) {
	l, err := New(NewMemory(nil), Options{Limits: map[string]Limit{"acme": {RequestsPerSecond: 1e12, Burst: 1 << 30, MaxConcurrent: 1 << 20}}})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
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
