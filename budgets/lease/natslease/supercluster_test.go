package natslease

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/hedgerow/hedgerow/budgets/lease"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
)

// renewTimeout bounds one renewal, as a region's renewer would.
const renewTimeout = 2 * time.Second

// startSupercluster is regions east and west, each a one-server NATS
// cluster with JetStream, joined by gateway links through fault proxies
// (natstest.Supercluster): cutting them cuts the link both ways.
func startSupercluster(t *testing.T) (east, west *server.Server, sc []*natstest.Region) {
	t.Helper()
	sc = natstest.Supercluster(t, []string{"east", "west"})
	return sc[0].Server, sc[1].Server, sc
}

// region renews its leases of one ceiling through its own cluster's
// server, keeping the last grant that reached it.
type region struct {
	name   string
	auth   *Authority
	demand float64
	held   lease.Held
}

const ceiling = "tenant:acme:rate"

var regions = lease.Options{Regions: []string{"east", "west"}}

func newRegion(t *testing.T, name string, s *server.Server, demand float64) *region {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, s))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	auth, err := New(ctx, js, Options{Placement: "east"})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &region{name: name, auth: auth, demand: demand}
}

// renew renews r's lease at now within renewTimeout.
func (r *region) renew(t *testing.T, now time.Time) (lease.Grant, error) {
	ctx, cancel := context.WithTimeout(t.Context(), renewTimeout)
	defer cancel()
	g, err := lease.RenewAt(ctx, r.auth, ceiling, lease.Ask{Region: r.name, Demand: r.demand, Held: r.held}, now, regions)
	if err == nil {
		r.held = lease.Held{Share: g.Share, Expires: g.Expires}
	}
	return g, err
}

func (r *region) mustRenew(t *testing.T, now time.Time) lease.Grant {
	t.Helper()
	g, err := r.renew(t, now)
	if err != nil {
		t.Fatalf("%s renewing at %v: %v", r.name, now.Format(time.TimeOnly), err)
	}
	return g
}

func (r *region) spending(t *testing.T, now time.Time) float64 {
	t.Helper()
	s, err := lease.Spending(r.held, now, regions)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var t0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// fallback is the safe share of two regions with default options.
const fallback = 0.5

func TestARegionCutOffFromTheBucketFallsToItsSafeShareAndRenewsAfterTheLinkHeals(t *testing.T) {
	eastNS, westNS, sc := startSupercluster(t)
	east := newRegion(t, "east", eastNS, 10)
	west := newRegion(t, "west", westNS, 90)
	// The bucket's subjects are east's subscriptions; west's server learns
	// of them through the gateway link a moment after the bucket exists,
	// and a read before that finds no responders.
	eventually.True(t, 10*time.Second, "west reading the bucket through the link", func() bool {
		_, _, err := west.auth.Get(ctxOf(t, renewTimeout), ceiling)
		return err == nil
	})

	// (a) West renews through the gateway link. Past the new table's
	// learning, the shares follow demand: west's grows past the safe share.
	now := t0
	for range 8 {
		east.mustRenew(t, now)
		now = now.Add(2 * time.Second)
		west.mustRenew(t, now)
		now = now.Add(2 * time.Second)
	}
	tb, _, err := east.auth.Get(ctxOf(t, renewTimeout), ceiling)
	if err != nil {
		t.Fatal(err)
	}
	if g := tb.Grants["west"]; g.Share != west.held.Share || !g.Expires.Equal(west.held.Expires) {
		t.Fatalf("east reads west's grant as %+v, want what west was granted, %+v", g, west.held)
	}
	stream, err := jetstream.New(natstest.Connect(t, westNS))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := stream.Stream(ctxOf(t, renewTimeout), "KV_"+DefaultBucket); err != nil {
		t.Fatal(err)
	} else if c := info.CachedInfo().Cluster; c == nil || c.Name != "east" {
		t.Fatalf("the bucket's stream is in cluster %+v, want east", c)
	}
	if west.held.Share <= fallback {
		t.Fatalf("west, asking for 90%% of the demand, holds %.3f, not more than the safe share: the fall below would not show", west.held.Share)
	}

	// (b) The link is cut both ways: the proxies forward nothing, as a
	// network dropping packets. West's renewal gets no answer and fails
	// at its deadline.
	natstest.Cut(sc)
	start := time.Now()
	if _, err := west.renew(t, now); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("west renewing across the cut link: %v, want its deadline exceeded", err)
	} else if took := time.Since(start); took > renewTimeout+time.Second {
		t.Fatalf("west's renewal failed after %v, not within its %v deadline", took, renewTimeout)
	} else {
		t.Logf("west renewing across the cut link failed after %v: %v", took.Round(time.Millisecond), err)
	}
	// The meta layer is cut in two as well (two peers, no quorum either
	// side): no bucket can be created, and west cannot bind to the lease
	// bucket; east, whose cluster holds it, can.
	jsEast, err := jetstream.New(natstest.Connect(t, eastNS))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsEast.CreateKeyValue(ctxOf(t, renewTimeout), jetstream.KeyValueConfig{Bucket: "another"}); err == nil {
		t.Error("a bucket was created with the meta layer cut in two")
	}
	if _, err := New(ctxOf(t, renewTimeout), jsEast, Options{Placement: "east"}); err != nil {
		t.Errorf("east binding to the lease bucket in its own cluster while cut off: %v", err)
	}
	jsWest, err := jetstream.New(natstest.Connect(t, westNS))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctxOf(t, renewTimeout), jsWest, Options{Placement: "east"}); err == nil {
		t.Error("west bound to the lease bucket across the cut link")
	}

	// East keeps renewing; west spends its last grant until its expiry
	// (less the skew), then its safe share. East is granted no more than
	// west's lease leaves until the authority counts it expired, then
	// what west's safe share leaves.
	last := west.held
	for ; !now.After(last.Expires.Add(2 * time.Second)); now = now.Add(time.Second) {
		g := east.mustRenew(t, now)
		spends := west.spending(t, now)
		if g.Share+spends > 1+1e-9 {
			t.Fatalf("at %v east was granted %.3f while west spends %.3f", now.Format(time.TimeOnly), g.Share, spends)
		}
	}
	if spends := west.spending(t, now); spends != min(last.Share, fallback) {
		t.Fatalf("west spends %.3f of its grant of %.3f past its expiry, want its safe share %.3f", spends, last.Share, min(last.Share, fallback))
	}
	if east.held.Share != 1-fallback {
		t.Fatalf("east holds %.3f once west's lease expired, want what west's safe share leaves, %.3f", east.held.Share, 1-fallback)
	}

	// Once the servers notice the link is dead (pings unanswered), west's
	// renewals fail at once: nothing in its cluster answers the bucket's
	// subjects.
	eventually.True(t, 20*time.Second, "the cut gateway links noticed and dropped", func() bool {
		return westNS.NumOutboundGateways() == 0 && eastNS.NumOutboundGateways() == 0
	})
	start = time.Now()
	if _, err := west.renew(t, now); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("west renewing once the link is down: %v, want no responders", err)
	} else {
		t.Logf("west renewing once the link is down failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}

	// (c) The link heals: the gateways reconnect and west renews again.
	natstest.Heal(sc)
	eventually.True(t, 30*time.Second, "west renewing after the link healed", func() bool {
		_, err := west.renew(t, now)
		return err == nil
	})
	tb, _, err = east.auth.Get(ctxOf(t, renewTimeout), ceiling)
	if err != nil {
		t.Fatal(err)
	}
	if g := tb.Grants["west"]; !g.Expires.Equal(now.Add(lease.DefaultValidity)) || g.Share != west.held.Share {
		t.Fatalf("east reads west's grant as %+v, want the one west renewed at %v, %+v", g, now.Format(time.TimeOnly), west.held)
	}
}
