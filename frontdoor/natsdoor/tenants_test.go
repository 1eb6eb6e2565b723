package natsdoor

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/hedgerow/hedgerow/budgets/slice"
	"github.com/hedgerow/hedgerow/budgets/slice/slicetest"
	"github.com/hedgerow/hedgerow/dispatcher"
	"github.com/hedgerow/hedgerow/frontdoor"
	"github.com/hedgerow/hedgerow/frontdoor/frontdoortest"
	"github.com/hedgerow/hedgerow/frontdoor/tenantlimit"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/schemas"
)

// tenantOptions is a door with tenants acme (limited by limit) and other
// (unlimited), on one gateway's slices on clock.
func tenantOptions(t *testing.T, limit tenantlimit.Limit, clock *frontdoortest.SettableClock) (Options, *tenantlimit.Limiter) {
	t.Helper()
	keys, l := frontdoortest.TenantLimits(t, limit, slicetest.Slices(t, slice.NewMemory(clock.Now), clock.Now))
	return Options{Keyring: keys, Limiter: l}, l
}

func bearer(key string) nats.Header {
	return nats.Header{schemas.HeaderAuthorization: {"Bearer " + key}}
}

func answered(t *testing.T, m *nats.Msg) {
	t.Helper()
	if got := m.Header.Get(schemas.HeaderStatus); got != schemas.StatusDone {
		t.Fatalf("%s = %q (body %s), want %q", schemas.HeaderStatus, got, m.Data, schemas.StatusDone)
	}
}

// slotFree reports whether acme has a slot free, without keeping it.
func slotFree(l *tenantlimit.Limiter) func() bool {
	return func() bool { return frontdoortest.SlotsFree(l, 1) }
}

func TestNATSDoorRefusesARequestWithoutItsTenantsKeyBeforeAnythingRuns(t *testing.T) {
	opts, _ := tenantOptions(t, tenantlimit.Limit{}, frontdoortest.NewSettableClock())
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), opts)
	tests := []struct {
		name   string
		header nats.Header
	}{
		{"no key at all", nil},
		{"a wrong key", bearer("not-a-key")},
		{"a key without its Bearer scheme", nats.Header{schemas.HeaderAuthorization: {frontdoortest.AcmeKey}}},
		{"a key under another scheme", nats.Header{schemas.HeaderAuthorization: {"Basic " + frontdoortest.AcmeKey}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := request(t, d.nc, submitBody(t, false), tc.header)
			errorAnswer(t, m, schemas.ErrUnauthenticated, 401)
			if got := m.Header.Get(schemas.HeaderShouldRetry); got != "false" {
				t.Errorf("%s = %q, want false", schemas.HeaderShouldRetry, got)
			}
			for k, vs := range m.Header {
				if strings.Contains(k+strings.Join(vs, " "), frontdoortest.AcmeKey) {
					t.Errorf("header %s echoes the key", k)
				}
			}
			if strings.Contains(string(m.Data), frontdoortest.AcmeKey) {
				t.Error("the answer echoes the key")
			}
		})
	}
	if n := len(d.sub.Submissions()); n != 0 {
		t.Fatalf("%d submissions ran for unauthenticated requests", n)
	}
}

func TestNATSDoorCountsAKeyedRequestAgainstItsTenant(t *testing.T) {
	opts, _ := tenantOptions(t, tenantlimit.Limit{}, frontdoortest.NewSettableClock())
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), opts)
	for _, tc := range []struct{ key, tenant string }{{frontdoortest.AcmeKey, "acme"}, {frontdoortest.OtherKey, "other"}} {
		answered(t, request(t, d.nc, submitBody(t, false), bearer(tc.key)))
		subs := d.sub.Submissions()
		if got := subs[len(subs)-1].Tenant; got != tc.tenant {
			t.Fatalf("submission tenant %q, want %q", got, tc.tenant)
		}
	}
}

// Without a keyring the door asks for no key and submits as Options.Tenant.
func TestNATSDoorWithoutTenantsAsksForNoKey(t *testing.T) {
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), Options{Tenant: "internal"})
	answered(t, request(t, d.nc, submitBody(t, false), nil))
	if got := d.sub.Submissions()[0].Tenant; got != "internal" {
		t.Fatalf("submission tenant %q, want the configured %q", got, "internal")
	}
}

func TestNATSDoorRateLimitsATenantThenAdmitsItAfterTheRefill(t *testing.T) {
	clock := frontdoortest.NewSettableClock()
	opts, _ := tenantOptions(t, tenantlimit.Limit{RequestsPerSecond: 0.5, Burst: 2}, clock)
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), opts)
	for range 2 {
		answered(t, request(t, d.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey)))
	}
	m := request(t, d.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey))
	errorAnswer(t, m, schemas.ErrTenantRateLimited, 429)
	if m.Header.Get(schemas.HeaderRetryAfter) != "2" || m.Header.Get(schemas.HeaderShouldRetry) != "true" {
		t.Fatalf("retry hints %s=%q %s=%q; want 2 (one token at 0.5/s) and true", schemas.HeaderRetryAfter,
			m.Header.Get(schemas.HeaderRetryAfter), schemas.HeaderShouldRetry, m.Header.Get(schemas.HeaderShouldRetry))
	}
	answered(t, request(t, d.nc, submitBody(t, false), bearer(frontdoortest.OtherKey))) // another tenant is not limited by acme's
	if n := len(d.sub.Submissions()); n != 3 {
		t.Fatalf("%d submissions; want 3 (the refused request ran nothing)", n)
	}
	clock.Advance(2 * time.Second)
	answered(t, request(t, d.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey)))
}

// heldDoor is a door whose runtime holds every submission until release
// closes (then answers) or its caller leaves (then reports on gone).
func heldDoor(t *testing.T, opts Options) (d *door, arrived, gone chan struct{}, release chan struct{}) {
	arrived, gone, release = make(chan struct{}, 4), make(chan struct{}, 4), make(chan struct{})
	d = startDoor(t, func(ctx context.Context, sub dispatcher.Submission, sink dispatcher.Sink) (*dispatcher.Response, error) {
		arrived <- struct{}{}
		select {
		case <-release:
			return &dispatcher.Response{Content: "ok"}, nil
		case <-ctx.Done():
			gone <- struct{}{}
			return nil, ctx.Err()
		}
	}, opts)
	return d, arrived, gone, release
}

// hold sends a request of acme named id that reaches the runtime; its
// answer arrives on the subscription returned.
func hold(t *testing.T, d *door, arrived <-chan struct{}, id string) *nats.Subscription {
	t.Helper()
	inbox := d.nc.NewInbox()
	sub, err := d.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	h := bearer(frontdoortest.AcmeKey)
	h.Set(schemas.HeaderRequestID, id)
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitSubject, Reply: inbox, Header: h, Data: submitBody(t, false)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-arrived:
	case <-time.After(natsWait):
		t.Fatal("the request never reached the runtime")
	}
	return sub
}

func TestNATSDoorRefusesATenantsRequestOverItsConcurrencyUntilOneEnds(t *testing.T) {
	opts, limiter := tenantOptions(t, tenantlimit.Limit{MaxConcurrent: 1}, frontdoortest.NewSettableClock())
	d, arrived, _, release := heldDoor(t, opts)
	first := hold(t, d, arrived, "first")
	m := request(t, d.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey))
	errorAnswer(t, m, schemas.ErrTenantConcurrencyLimited, 429)
	if m.Header.Get(schemas.HeaderRetryAfter) != "1" || m.Header.Get(schemas.HeaderShouldRetry) != "true" {
		t.Fatalf("retry hints %q %q, want 1 and true", m.Header.Get(schemas.HeaderRetryAfter), m.Header.Get(schemas.HeaderShouldRetry))
	}
	close(release)
	ans, err := first.NextMsg(natsWait)
	if err != nil {
		t.Fatal(err)
	}
	answered(t, ans)
	eventually.True(t, natsWait, "acme's slot freed after its answer", slotFree(limiter))
	answered(t, request(t, d.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey)))
}

func TestNATSDoorFreesTheSlotOfARequestItsCallerCancelled(t *testing.T) {
	opts, limiter := tenantOptions(t, tenantlimit.Limit{MaxConcurrent: 1}, frontdoortest.NewSettableClock())
	d, arrived, gone, _ := heldDoor(t, opts)
	hold(t, d, arrived, "cancelled")
	if slotFree(limiter)() {
		t.Fatal("acme's slot is free while its request runs")
	}
	if err := d.nc.PublishMsg(&nats.Msg{Subject: schemas.SubmitCancelSubject("cancelled"), Header: bearer(frontdoortest.AcmeKey)}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-gone:
	case <-time.After(natsWait):
		t.Fatal("the cancelled request's submission never ended")
	}
	eventually.True(t, natsWait, "acme's slot freed after its caller cancelled", slotFree(limiter))
}

// An Idempotency-Key names a user action of the caller's tenant only: the
// same key from another tenant is another action (neither replayed nor
// refused as reused), and the same tenant's retry is replayed.
func TestNATSDoorKeepsEachTenantsIdempotencyKeysApart(t *testing.T) {
	opts, _ := tenantOptions(t, tenantlimit.Limit{}, frontdoortest.NewSettableClock())
	opts.Replays = replayOptions(t).Replays
	d := startDoor(t, frontdoortest.Answer(committed, false), opts)
	answered(t, request(t, d.nc, keyed(t, "k-1", false, 0), bearer(frontdoortest.AcmeKey)))
	// other sends the same key with another request: not acme's action.
	other := request(t, d.nc, keyed(t, "k-1", false, 0.5), bearer(frontdoortest.OtherKey))
	answered(t, other)
	if other.Header.Get(frontdoor.HeaderIdempotentReplayed) != "" {
		t.Fatal("another tenant's request was replayed acme's answer")
	}
	again := request(t, d.nc, keyed(t, "k-1", false, 0), bearer(frontdoortest.AcmeKey))
	answered(t, again)
	if again.Header.Get(frontdoor.HeaderIdempotentReplayed) != "true" {
		t.Fatal("acme's retry was not replayed")
	}
	subs := d.sub.Submissions()
	if len(subs) != 2 || subs[0].Tenant != "acme" || subs[1].Tenant != "other" {
		t.Fatalf("submissions %+v; want acme's then other's, the retry replayed", subs)
	}
}

// A caller at its tenant's concurrency limit that sends each request once it
// has the answer of the last is admitted every time, answered or failed: the
// slot is freed before the final message goes out (run), so the next request
// cannot overtake the release.
func TestNATSDoorAdmitsSequentialRequestsAtTheConcurrencyLimit(t *testing.T) {
	opts, _ := tenantOptions(t, tenantlimit.Limit{MaxConcurrent: 1}, frontdoortest.NewSettableClock())
	d := startDoor(t, frontdoortest.Answer(&dispatcher.Response{Content: "ok"}, false), opts)
	for range 20 {
		answered(t, request(t, d.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey)))
	}
	failing := startDoor(t, frontdoortest.Fail(&dispatcher.GroupError{Group: "g-1", Code: schemas.ErrAllRoutesFailed}), opts)
	for range 20 {
		errorAnswer(t, request(t, failing.nc, submitBody(t, false), bearer(frontdoortest.AcmeKey)), schemas.ErrAllRoutesFailed, 503)
	}
}
