package redisstore

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/hedgerow/hedgerow/budgets"
	"github.com/hedgerow/hedgerow/internal/redistest"
)

func TestReservationIDCarriesEveryEntityItSpans(t *testing.T) {
	h := entityHash
	tests := []struct {
		name string
		r    reservation
	}{
		{"a primary without a tenant ceiling", reservation{nonce: newNonce(), ua: h("ua")}},
		{"a primary with a tenant window", reservation{nonce: newNonce(), ua: h("ua"), tenant: h("t"), winLen: 3_600_000, winAt: 1_735_689_600_000}},
		{"a hedge under its cohort's ceiling", reservation{nonce: newNonce(), ua: h("ua"), source: srcCohort, pool: h("p"), cohort: h("c"), tenant: h("t"), winLen: 1, winAt: -5, slotMs: 1000, slot: 1_735_689_600}},
		{"a hedge paid by the reserve", reservation{nonce: newNonce(), ua: h("ua"), source: srcReserve, pool: h("p"), cohort: h("c"), slotMs: 1, slot: -3}},
		{"a replacement", reservation{nonce: newNonce(), ua: h("ua"), source: srcReplacement, pool: h("p"), cohort: h("c"), slotMs: 250, slot: 7}},
	}
	for _, tt := range tests {
		got, ok := parseReservation(tt.r.id())
		if !ok || got != tt.r {
			t.Errorf("%s: parse(%q) = %+v, %v; want %+v", tt.name, tt.r.id(), got, ok, tt.r)
		}
	}
}

// TestErrorReplyKeepsTheBreakerClosed checks that an error reply — Redis
// answered, the request was at fault — is reported as ErrUnavailable (an
// error of the store) but does not make later calls fail at once.
func TestErrorReplyKeepsTheBreakerClosed(t *testing.T) {
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	s, err := New(client, Options{Prefix: "reply", ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// A string where the route's flags hash belongs: HSET answers WRONGTYPE.
	if err := client.Set(ctx, s.keys.routeFlags(entityHash("route-spoilt")), "x", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	err = s.MarkRoute(ctx, "route-spoilt", budgets.RoutePushback, time.Second)
	var reply redis.Error
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &reply) || !redis.HasErrorPrefix(reply, "WRONGTYPE") {
		t.Fatalf("MarkRoute on a spoilt key: %v, want ErrUnavailable wrapping the WRONGTYPE reply", err)
	}
	if err := s.MarkRoute(ctx, "route-fine", budgets.RoutePushback, time.Second); err != nil {
		t.Errorf("MarkRoute after an error reply: %v, want it sent and answered", err)
	}
}
