package natsauth

import (
	"context"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/hedgerow/hedgerow/frontdoor/replay"
	"github.com/hedgerow/hedgerow/frontdoor/replay/actions"
	"github.com/hedgerow/hedgerow/internal/eventually"
	"github.com/hedgerow/hedgerow/internal/natstest"
	"github.com/hedgerow/hedgerow/schemas"
)

// The gateway user of a region may keep the index of committed user
// actions (docs/architecture.md §13, §14): create its two streams, publish
// an entry and a heartbeat, look a key up — and nothing its permissions
// refuse is needed for that. Other users may not publish an entry (the
// leases test checks the refusals).
func TestTheGatewayUserOfARegionKeepsTheIndexOfUserActions(t *testing.T) {
	s := spec()
	s.Region, s.LeasesBucket = "east", leasesBucket
	b, err := Generate(s)
	if err != nil {
		t.Fatal(err)
	}
	dir, loaded := writeAndLoad(t, b)
	ns := natstest.Start(t, natstest.JetStream(t.TempDir()), func(o *server.Options) { o.Nkeys = loaded.Nkeys })
	v := newViolations()
	x, err := actions.New(connectAs(t, b, dir, ns, UserGateway, v), actions.Options{Region: "east", Regions: []string{"east", "west"}})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(context.Background())
	eventually.Closed(t, busWait, "the index's streams created as the gateway user", x.Ready())
	key := replay.Key("tenant", "action")
	x.Publish(key, &replay.Answer{Fingerprint: "fp"})
	stream := schemas.RegionWire("east").JetStreamName(actions.StreamName)
	eventually.True(t, busWait, "east's entry and heartbeat kept in "+stream, func() bool {
		jsz, err := ns.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range jsz.AccountDetails {
			for _, st := range a.Streams {
				if st.Name == stream {
					return st.State.Msgs >= 2
				}
			}
		}
		return false
	})
	ctx, cancel := context.WithTimeout(t.Context(), busWait)
	defer cancel()
	if c, err := x.Committed(ctx, key); err != nil || c != nil {
		t.Fatalf("looking a key up as the gateway user: %+v, %v; want nothing found (east's copy holds west's only)", c, err)
	}
	if len(v.all()) != 0 {
		t.Fatalf("the gateway user's index hit permission violations: %v", v.all())
	}
}
