package redisstore_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/budgets/redisstore"
	"github.com/hedgerow/hedgerow/schemas"
)

// keyLayout is the shape of every key: the prefix, one hash tag naming the
// entity by the hash of its id, and a suffix of the store's own.
var keyLayout = regexp.MustCompile(`^lay:\{(ua|tenant|pool|route):[A-Za-z0-9_-]{22}\}(:[A-Za-z0-9_:-]+)?$`)

// keysOf returns every key under prefix on every server behind client, with
// its remaining TTL.
func keysOf(t *testing.T, client redis.UniversalClient, prefix string) map[string]time.Duration {
	t.Helper()
	var mu sync.Mutex
	found := map[string]time.Duration{}
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			ttl, err := c.PTTL(ctx, iter.Val()).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			found[iter.Val()] = ttl
			mu.Unlock()
		}
		return iter.Err()
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(t.Context(), scan)
	case *redis.Client:
		err = scan(t.Context(), c)
	default:
		t.Fatalf("cannot scan a %T", client)
	}
	if err != nil {
		t.Fatalf("scanning keys: %v", err)
	}
	return found
}

// TestIDsWithBracesStayInTheirEntitysHashTag drives every call with ids
// that contain braces (which would move a raw id's hash tag, and on a
// cluster make a script's keys span slots) and checks the keys it leaves:
// one hash tag per entity holding a hash of the id, never the id itself,
// and a TTL on every key so Redis collects what the store forgets.
func TestIDsWithBracesStayInTheirEntitysHashTag(t *testing.T) {
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			client := be.client(t)
			store, err := redisstore.New(client, redisstore.Options{Prefix: "lay", Timeout: suiteTimeout})
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			p := ceilinged("secret-user}{ua")
			p.Tenant, p.Pool, p.Window = "{secret-tenant", "po}ol", "{co}h{"
			const route = "{route}"

			a, err := store.Admit(ctx, p)
			if err != nil || !a.Allowed {
				t.Fatalf("Admit: %+v, %v", a, err)
			}
			g, err := store.ReserveExtra(ctx, hedgeOf(p, route))
			if err != nil || !g.Allowed {
				t.Fatalf("ReserveExtra: %+v, %v", g, err)
			}
			for _, err := range []error{
				store.MarkRoute(ctx, route, budgets.RouteQuarantined, time.Minute),
				store.AcquireLease(ctx, route, "holder", time.Minute),
				store.Settle(ctx, g.Reservation, schemas.Usage{OutputUnits: 7}),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			if states, err := store.RouteStates(ctx, []string{route}); err != nil || states[route] != budgets.RouteQuarantined {
				t.Errorf("RouteStates: %v, %v", states, err)
			}
			if n, err := store.InFlight(ctx, []string{route}); err != nil || n[route] != 1 {
				t.Errorf("InFlight: %v, %v", n, err)
			}

			kinds := map[string]bool{}
			for key, ttl := range keysOf(t, client, "lay:") {
				m := keyLayout.FindStringSubmatch(key)
				if m == nil {
					t.Errorf("key %q does not follow the layout", key)
					continue
				}
				kinds[m[1]] = true
				if strings.Contains(key, "secret") {
					t.Errorf("key %q holds an id in clear", key)
				}
				if ttl <= 0 {
					t.Errorf("key %q has no TTL (%v): Redis would never collect it", key, ttl)
				}
			}
			for _, kind := range []string{"ua", "tenant", "pool", "route"} {
				if !kinds[kind] {
					t.Errorf("no {%s:…} key was written", kind)
				}
			}
			for _, id := range []budgets.ReservationID{a.Reservation, g.Reservation} {
				if strings.Contains(string(id), "secret") {
					t.Errorf("reservation id %q holds an id in clear", id)
				}
			}
		})
	}
}

// TestDamagedReservationIDIsUnknownAndChangesNothing ends a reservation
// under ids damaged on their way back — garbled, truncated, extended, with
// any one field altered — and checks each is refused as unknown while the
// real reservation stays live, every share of it.
func TestDamagedReservationIDIsUnknownAndChangesNothing(t *testing.T) {
	client := backends[0].client(t)
	store, err := redisstore.New(client, redisstore.Options{Prefix: "forge", Timeout: suiteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	req := ceilinged("ua-forge")
	req.Attempts.Max = 1
	a, err := store.Admit(ctx, req)
	if err != nil || !a.Allowed {
		t.Fatalf("Admit: %+v, %v", a, err)
	}
	id := string(a.Reservation)
	fields := strings.Split(id, ".")
	replace := func(i int, v string) budgets.ReservationID {
		f := append([]string(nil), fields...)
		f[i] = v
		return budgets.ReservationID(strings.Join(f, "."))
	}
	other := "AAAAAAAAAAAAAAAAAAAAAA"
	forged := []struct {
		name string
		id   budgets.ReservationID
	}{
		{"empty", ""},
		{"garbage", "not-a-reservation"},
		{"truncated", budgets.ReservationID(id[:len(id)-3])},
		{"extended", budgets.ReservationID(id + ".1")},
		{"another version", replace(0, "r0")},
		{"another nonce", replace(1, other)},
		{"another user action", replace(2, other)},
		{"a nonce that is no hash", replace(1, "short")},
		{"another token source", replace(3, "1")},
		{"a key pattern as the user action", replace(2, "*")},
		{"another tenant window", replace(8, "0")},
		{"another digest", replace(len(fields)-1, "AAAAAAAAAAAA")},
	}
	for _, f := range forged {
		if err := store.Release(ctx, f.id); !errors.Is(err, budgets.ErrUnknownReservation) {
			t.Errorf("Release(%s): %v, want ErrUnknownReservation", f.name, err)
		}
		if err := store.Settle(ctx, f.id, schemas.Usage{OutputUnits: 1}); !errors.Is(err, budgets.ErrUnknownReservation) {
			t.Errorf("Settle(%s): %v, want ErrUnknownReservation", f.name, err)
		}
	}
	// The real reservation is still live: it holds the only slot and its
	// units of the tenant's ceiling.
	if again, err := store.Admit(ctx, req); err != nil || again.Reason != budgets.ReasonAttempts {
		t.Errorf("Admit beside the live reservation: %+v, %v; want the ledger full", again, err)
	}
	probe := ceilinged("ua-probe")
	probe.Spend.TenantCeiling = probe.Spend.Units() * 2
	probe.Spend.OutputUnits++
	if p, err := store.Admit(ctx, probe); err != nil || p.Reason != budgets.ReasonSpendTenant {
		t.Errorf("Admit of more than the tenant's room beside the live reservation: %+v, %v", p, err)
	}
	if err := store.Release(ctx, a.Reservation); err != nil {
		t.Errorf("Release of the real reservation: %v", err)
	}
}

func TestNewRefusesUnusableOptions(t *testing.T) {
	client := backends[0].client(t)
	deaf := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = deaf.Close() })
	tests := []struct {
		name   string
		client redis.UniversalClient
		opts   redisstore.Options
	}{
		{"no client", nil, redisstore.Options{}},
		{"a client that ignores context deadlines", deaf, redisstore.Options{}},
		{"a prefix with an opening brace", client, redisstore.Options{Prefix: "a{b"}},
		{"a prefix with a closing brace", client, redisstore.Options{Prefix: "a}"}},
		{"a negative timeout", client, redisstore.Options{Timeout: -time.Millisecond}},
	}
	for _, tt := range tests {
		if s, err := redisstore.New(tt.client, tt.opts); err == nil {
			t.Errorf("New with %s: %v, want an error", tt.name, s)
		}
	}
	if _, err := redisstore.New(client, redisstore.Options{}); err != nil {
		t.Errorf("New with the defaults: %v", err)
	}
}
